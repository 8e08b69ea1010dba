"""AsyncEngine: the (not thread-safe) Engine driven by one dedicated thread, fed from asyncio.

Threads and ownership:
- The engine thread is the only one that touches ``Engine``. It takes add/abort commands from a
  list guarded by a Condition, applies them between steps, and sleeps on the Condition when it
  has nothing to do (no busy spin).
- The asyncio thread (the HTTP event loop) owns every ``RequestGroup`` and the metrics. Step
  outputs cross over in one ``loop.call_soon_threadsafe`` per step and are fanned out to the
  groups' asyncio.Queues there, so no per-request lock exists anywhere.
- ``stats`` is an immutable snapshot the engine thread replaces after each step; readers on any
  thread see either the old or the new one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from anycore.config import EngineConfig
from anycore.outputs import StepOutput
from anycore.sampling_params import SamplingParams
from anycore.server.metrics import ServerMetrics

log = logging.getLogger("anycore.server")


class EngineOverloaded(Exception):
    """Admission would exceed ``max_queued_requests``."""


class EngineNotReady(Exception):
    """The model is still loading, failed to load, or the engine is shutting down."""


@dataclass(frozen=True)
class EngineStats:
    num_waiting: int = 0
    num_running: int = 0
    kv_slots_total: int = 0
    kv_slots_used: int = 0  # includes slots owned only by the prefix cache
    kv_slots_cached: int = 0  # evictable prefix-cache slots (reusable, not held by any request)
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    num_steps: int = 0
    num_preemptions: int = 0  # running requests whose KV was released to make room (they are re-queued)

    @property
    def kv_slots_held(self) -> int:
        """Slots pinned by live requests (or locked prefixes); 0 when nothing is in flight."""
        return self.kv_slots_used - self.kv_slots_cached


class RequestGroup:
    """The sub-requests of one HTTP request (n samples x prompts) sharing one queue.

    Iterate it for StepOutputs until every sub-request finished; ``close()`` (or leaving
    ``async with``) aborts what is unfinished, e.g. when the client went away.
    """

    def __init__(self, owner: AsyncEngine, request_ids: list[str]) -> None:
        self.owner = owner
        self.request_ids = request_ids
        self.queue: asyncio.Queue[StepOutput] = asyncio.Queue()
        self.unfinished = set(request_ids)
        self.arrival = time.monotonic()

    def __aiter__(self) -> RequestGroup:
        return self

    async def __anext__(self) -> StepOutput:
        if not self.unfinished and self.queue.empty():
            raise StopAsyncIteration
        out = await self.queue.get()
        if out.finished:
            self.unfinished.discard(out.request_id)
        return out

    def close(self) -> None:
        self.owner._close_group(self)

    async def __aenter__(self) -> RequestGroup:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


class AsyncEngine:
    def __init__(
        self,
        config: EngineConfig,
        max_queued_requests: int | None = None,
        engine_factory: Callable[[EngineConfig], Any] | None = None,
    ) -> None:
        self.config = config
        self.max_queued_requests = max_queued_requests
        self._factory = engine_factory
        self.engine: Any = None
        self.state = "loading"  # loading | ready | failed | stopped
        self.load_error: str | None = None
        self.stats = EngineStats()
        self.metrics = ServerMetrics()
        # engine-thread side
        self._cond = threading.Condition()
        self._commands: list[tuple[str, Any]] = []
        self._stop = False
        self._live: set[str] = set()
        self._thread: threading.Thread | None = None
        # asyncio side
        self._loop: asyncio.AbstractEventLoop | None = None
        self._groups: dict[str, RequestGroup] = {}
        self._unstarted: set[str] = set()  # sub-requests that have produced no output yet
        self._last_time: dict[str, float] = {}

    # ---- lifecycle --------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop, on_ready: Callable[[], None] | None = None,
              on_failed: Callable[[str], None] | None = None) -> None:
        """Starts the engine thread, which loads the model and then serves commands."""
        self._loop = loop
        self._on_ready = on_ready
        self._on_failed = on_failed
        self._thread = threading.Thread(target=self._thread_main, name="anycore-engine", daemon=True)
        self._thread.start()

    async def shutdown(self, timeout: float = 30.0) -> None:
        """Aborts whatever is in flight (their streams end with finish_reason 'abort') and joins the thread."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, timeout)
            if self._thread.is_alive():
                log.warning("engine thread did not stop within %.0fs", timeout)
        if self.state != "failed":  # keep the load failure visible (the exit status depends on it)
            self.state = "stopped"

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    @property
    def is_ready(self) -> bool:
        return self.state == "ready"

    # ---- asyncio-side API -------------------------------------------------------------------
    def add_group(self, requests: list[tuple[str, list[int], SamplingParams]]) -> RequestGroup:
        """Queues sub-requests (id, prompt ids, params with n == 1) as one group.

        Raises EngineNotReady / EngineOverloaded before anything is queued.
        """
        if self.state != "ready":
            raise EngineNotReady(self.load_error or f"the engine is {self.state}")
        limit = self.max_queued_requests
        if limit is not None and len(self._unstarted) + len(requests) > limit:
            raise EngineOverloaded(
                f"the server has {len(self._unstarted)} queued requests (limit {limit}); retry later"
            )
        group = RequestGroup(self, [rid for rid, _, _ in requests])
        for rid, _, _ in requests:
            if rid in self._groups:
                raise ValueError(f"duplicate request id {rid!r}")
        for rid, _, _ in requests:
            self._groups[rid] = group
            self._unstarted.add(rid)
        self.metrics.on_arrival(len(requests))
        self._submit([("add", (rid, ids, params)) for rid, ids, params in requests])
        return group

    def abort(self, request_ids: list[str]) -> None:
        self._submit([("abort", rid) for rid in request_ids])

    def abort_all(self, reason: str) -> None:
        """Ends every in-flight request with an error (used when the shutdown grace period is over)."""
        self._submit([("abort_all", reason)])

    @property
    def num_queued(self) -> int:
        return len(self._unstarted)

    def _close_group(self, group: RequestGroup) -> None:
        if group.unfinished:
            self.abort(sorted(group.unfinished))
            for _ in group.unfinished:
                self.metrics.on_finished("abort", 0, 0, None)
        for rid in group.request_ids:
            if self._groups.get(rid) is group:
                del self._groups[rid]
            self._unstarted.discard(rid)
            self._last_time.pop(rid, None)
        group.unfinished.clear()

    def _submit(self, commands: list[tuple[str, Any]]) -> None:
        with self._cond:
            self._commands.extend(commands)
            self._cond.notify()

    def _deliver(self, outputs: list[StepOutput]) -> None:
        """Runs on the event loop: route outputs to their groups and record latency metrics."""
        now = time.monotonic()
        m = self.metrics
        for out in outputs:
            rid = out.request_id
            group = self._groups.get(rid)
            if group is None:  # closed already (client gone): nothing to record
                continue
            if rid in self._unstarted:
                self._unstarted.discard(rid)
                if out.new_token_ids:
                    m.on_first_token(now - group.arrival)
            elif out.new_token_ids and rid in self._last_time:
                m.on_inter_token(now - self._last_time[rid], len(out.new_token_ids))
            self._last_time[rid] = now
            m.on_tokens(len(out.new_token_ids))
            if out.finished:
                self._last_time.pop(rid, None)
                m.on_finished(out.finish_reason if out.error is None else "error", out.num_prompt_tokens,
                              out.num_cached_tokens, now - group.arrival)
            group.queue.put_nowait(out)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # loop closed between the check and the call
            pass

    # ---- engine thread ----------------------------------------------------------------------
    def _thread_main(self) -> None:
        try:
            if self._factory is not None:
                self.engine = self._factory(self.config)
            else:
                from anycore.engine.engine import Engine

                self.engine = Engine(self.config)
        except BaseException as e:  # noqa: BLE001 - reported to the server, which exits
            if not isinstance(e, (ValueError, OSError)):  # a bad path or flag needs no traceback
                log.exception("model failed to load")
            self.load_error = f"model failed to load: {e}"
            self.state = "failed"
            if self._on_failed is not None:
                self._post(self._on_failed, self.load_error)
            return
        self._publish_stats()
        self.state = "ready"
        if self._on_ready is not None:
            self._post(self._on_ready)
        try:
            self._loop_forever()
        finally:
            self._abort_all("the server is shutting down")

    def _loop_forever(self) -> None:
        engine = self.engine
        while True:
            with self._cond:
                while not self._commands and not self._stop and not engine.has_unfinished():
                    self._cond.wait()
                commands, self._commands = self._commands, []
                if self._stop:
                    return
            if commands:
                self._apply(commands)
            if not engine.has_unfinished():
                self._publish_stats()
                continue
            try:
                outputs = engine.step()
            except Exception as e:  # noqa: BLE001 - fail the in-flight requests, keep serving
                log.exception("engine step failed")
                self._abort_all(f"internal engine error: {e}")
                continue
            for out in outputs:
                if out.finished:
                    self._live.discard(out.request_id)
            self._publish_stats()
            if outputs:
                self._post(self._deliver, outputs)

    def _apply(self, commands: list[tuple[str, Any]]) -> None:
        engine = self.engine
        failed: list[StepOutput] = []
        for kind, arg in commands:
            if kind == "add":
                rid, ids, params = arg
                try:
                    engine.add_request(ids, params, request_id=rid)
                except ValueError as e:
                    failed.append(_error_output(rid, str(e)))
                else:
                    self._live.add(rid)
            elif kind == "abort":
                if arg in self._live:
                    self._live.discard(arg)
                    engine.abort(arg)
            elif kind == "abort_all":
                self._abort_all(arg)
        if failed:
            self._post(self._deliver, failed)

    def _abort_all(self, reason: str) -> None:
        outs = []
        for rid in sorted(self._live):
            try:
                self.engine.abort(rid)
            except Exception:  # noqa: BLE001 - best effort while failing requests
                log.exception("abort of %s failed", rid)
            outs.append(_error_output(rid, reason))
        self._live.clear()
        self._publish_stats()
        if outs:
            self._post(self._deliver, outs)

    def _publish_stats(self) -> None:
        e = self.engine
        kv = e.kv
        radix = getattr(kv, "radix", None)
        self.stats = EngineStats(
            num_waiting=len(e.scheduler.waiting),
            num_running=len(e.scheduler.running),
            kv_slots_total=kv.num_slots,
            kv_slots_used=kv.num_used,
            kv_slots_cached=radix.evictable_size if radix is not None else 0,
            prefix_queried_tokens=radix.queried_tokens if radix is not None else 0,
            prefix_hit_tokens=radix.hit_tokens if radix is not None else 0,
            num_steps=self.stats.num_steps + 1,
            num_preemptions=getattr(e.scheduler, "num_preemptions", 0),
        )


def _error_output(rid: str, message: str) -> StepOutput:
    return StepOutput(request_id=rid, new_token_ids=[], delta_text="", finished=True, finish_reason="abort",
                      error=message)
