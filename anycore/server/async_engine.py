"""AsyncEngine: the (not thread-safe) Engine driven by one dedicated thread, fed from asyncio.

Threads and ownership:
- The engine thread is the only one that touches ``Engine``. It takes add/abort commands from a
  list guarded by a Condition, applies them between steps, and sleeps on the Condition when it
  has nothing to do (no busy spin).
- The asyncio thread (the HTTP event loop) owns every ``RequestGroup`` and the metrics. Step
  outputs cross over in one ``loop.call_soon_threadsafe`` per step and are fanned out to the
  groups' asyncio.Queues there, so no per-request lock exists anywhere.
- ``stats`` is the immutable ``Engine.stats()`` snapshot the engine thread replaces after each
  step; readers on any thread see either the old or the new one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from anycore.config import EngineConfig
from anycore.engine.input_processor import EngineRequest
from anycore.errors import AnycoreError, EngineFailure, InvalidRequest, NotReady, Overloaded, ShuttingDown
from anycore.outputs import EngineStats, StepOutput
from anycore.server.metrics import ServerMetrics

log = logging.getLogger("anycore.server")


class RequestGroup:
    """The sub-requests of one HTTP request (n samples x prompts) sharing one queue.

    Iterate it for StepOutputs until every sub-request finished; ``close()`` (or leaving
    ``async with``) aborts what is unfinished, e.g. when the client went away. Lives on the
    event loop only.
    """

    def __init__(self, owner: AsyncEngine, request_ids: list[str]) -> None:
        self.owner = owner
        self.request_ids = request_ids
        self.queue: asyncio.Queue[StepOutput] = asyncio.Queue()
        self.unfinished = set(request_ids)
        self.arrival = time.monotonic()
        self.last_output: dict[str, float] = {}  # sub-request -> when its latest output arrived
        self.closed = False

    @property
    def num_unstarted(self) -> int:
        """Sub-requests that have had no output yet (they count against the queue limit)."""
        return len(self.request_ids) - len(self.last_output)

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
    def __init__(self, config: EngineConfig, max_queued_requests: int | None,
                 engine_factory: Callable[[EngineConfig], Any] | None = None, self_check: bool = False) -> None:
        """``max_queued_requests``: admitted sub-requests without output beyond which ``add_group``
        raises Overloaded (None: no limit); ServerConfig holds its default. ``self_check``: time
        a few decode steps once the model is loaded, before serving (engine/self_check.py)."""
        self.config = config
        self.max_queued_requests = max_queued_requests
        self._factory = engine_factory
        self._run_self_check = self_check
        self.self_check: Any = None  # a DecodeSelfCheck once it ran
        self.engine: Any = None
        self.state = "loading"  # loading | ready | failed | stopped
        self.load_error: str | None = None
        self.stats = EngineStats()
        self.num_snapshots = 0  # stats publications: steps and idle wake-ups
        self.metrics = ServerMetrics()
        # engine-thread side
        self._cond = threading.Condition()
        self._commands: list[tuple[str, Any]] = []
        self._stop = False
        self._thread: threading.Thread | None = None
        # asyncio side
        self._loop: asyncio.AbstractEventLoop | None = None
        self._groups: dict[str, RequestGroup] = {}  # by sub-request id, until the group closes
        self._num_unstarted = 0  # sum of the open groups' num_unstarted

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

    def require_ready(self) -> None:
        if not self.is_ready:
            message = self.load_error if self.state == "failed" else f"the model is {self.state}; retry shortly"
            raise NotReady(message or "the server is not ready")

    # ---- asyncio-side API -------------------------------------------------------------------
    def add_group(self, requests: list[EngineRequest]) -> RequestGroup:
        """Queues validated sub-requests as one group; raises NotReady, Overloaded or
        InvalidRequest (a duplicate id) before anything is queued."""
        self.require_ready()
        limit = self.max_queued_requests
        if limit is not None and self._num_unstarted + len(requests) > limit:
            raise Overloaded(f"the server has {self._num_unstarted} queued requests (limit {limit}); retry later")
        ids = [r.request_id for r in requests]
        seen: set[str] = set()
        for rid in ids:
            if rid in self._groups or rid in seen:
                raise InvalidRequest(f"duplicate request id {rid!r}")
            seen.add(rid)
        group = RequestGroup(self, ids)
        for rid in ids:
            self._groups[rid] = group
        self._num_unstarted += len(ids)
        self.metrics.on_arrival(len(ids))
        self._submit([("add", r) for r in requests])
        return group

    def abort(self, request_ids: list[str]) -> None:
        self._submit([("abort", rid) for rid in request_ids])

    def abort_all(self, reason: str) -> None:
        """Ends every in-flight request with ShuttingDown (when the shutdown grace period is over)."""
        self._submit([("abort_all", reason)])

    @property
    def num_queued(self) -> int:
        return self._num_unstarted

    def _close_group(self, group: RequestGroup) -> None:
        if group.closed:
            return
        group.closed = True
        if group.unfinished:
            self.abort(sorted(group.unfinished))
            for _ in group.unfinished:
                self.metrics.on_finished("abort", 0, 0, None)
        for rid in group.request_ids:
            if self._groups.get(rid) is group:
                del self._groups[rid]
        self._num_unstarted -= group.num_unstarted
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
            last = group.last_output.get(rid)
            if last is None:
                self._num_unstarted -= 1
                if out.new_token_ids:
                    m.on_first_token(now - group.arrival)
            elif out.new_token_ids:
                m.on_inter_token(now - last, len(out.new_token_ids))
            group.last_output[rid] = now
            m.on_tokens(len(out.new_token_ids))
            if out.finished:
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
        if self._run_self_check:
            self._decode_self_check()
        self._publish_stats()
        self.state = "ready"
        parallel = getattr(self.engine, "parallel", None)
        if parallel is not None:  # a lost tensor-parallel rank fails the server (health 503)
            parallel.group.on_failure(self._rank_failed)
        if self._on_ready is not None:
            self._post(self._on_ready)
        try:
            self._loop_forever()
        finally:
            if self.state == "failed":
                self._abort_all(EngineFailure, self.load_error or "the engine failed")
            else:
                self._abort_all(ShuttingDown, "the server is shutting down")
            close = getattr(self.engine, "close", None)  # (stops tensor-parallel workers)
            if close is not None:
                close()

    def _rank_failed(self, message: str) -> None:
        """(any thread) The engine lost a rank: it cannot serve again; the loop ends its requests."""
        self.load_error = message
        self.state = "failed"
        with self._cond:
            self._cond.notify()

    def _decode_self_check(self) -> None:
        from anycore.engine.self_check import decode_self_check

        try:
            self.self_check = decode_self_check(self.engine)
        except Exception as e:  # noqa: BLE001 - a check that cannot run must not stop the server
            log.warning("decode self-check could not run: %s", e)
            return
        (log.warning if self.self_check.slow else log.info)("self-check: %s", self.self_check.summary())

    def _loop_forever(self) -> None:
        engine = self.engine
        while True:
            with self._cond:
                while (not self._commands and not self._stop and not engine.has_unfinished()
                       and self.state != "failed"):
                    self._cond.wait()
                commands, self._commands = self._commands, []
                if self._stop or self.state == "failed":
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
                self._abort_all(EngineFailure, f"internal engine error: {e}")
                continue
            self._publish_stats()
            if outputs:
                self._post(self._deliver, outputs)

    def _apply(self, commands: list[tuple[str, Any]]) -> None:
        engine = self.engine
        failed: list[StepOutput] = []
        for kind, arg in commands:
            if kind == "add":
                r: EngineRequest = arg
                try:
                    engine.add_request(r.prompt_token_ids, r.params, r.request_id, r.index)
                except AnycoreError as e:
                    failed.append(_error_output(r, e))
                except ValueError as e:  # the scheduler's KV-pool capacity check
                    failed.append(_error_output(r, InvalidRequest(str(e))))
            elif kind == "abort":
                engine.abort(arg)
            elif kind == "abort_all":
                self._abort_all(ShuttingDown, arg)
        if failed:
            self._post(self._deliver, failed)

    def _abort_all(self, error: type[AnycoreError], message: str) -> None:
        outs = []
        for rid in self.engine.request_ids():
            try:
                self.engine.abort(rid)
            except Exception:  # noqa: BLE001 - best effort while failing requests
                log.exception("abort of %s failed", rid)
            outs.append(StepOutput(request_id=rid, new_token_ids=[], delta_text="", finished=True,
                                   finish_reason="abort", error=error(message)))
        self._publish_stats()
        if outs:
            self._post(self._deliver, outs)

    def _publish_stats(self) -> None:
        self.stats = self.engine.stats()
        self.num_snapshots += 1


def _error_output(r: EngineRequest, error: AnycoreError) -> StepOutput:
    return StepOutput(request_id=r.request_id, new_token_ids=[], delta_text="", finished=True, finish_reason="abort",
                      index=r.index, error=error)
