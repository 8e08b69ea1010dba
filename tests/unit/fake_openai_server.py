"""A tiny OpenAI-compatible streaming server for the bench tests (plain asyncio, no anycore import).

It answers ``GET /health``, ``GET /v1/models`` and streaming ``POST /v1/completions`` with SSE
``data:`` chunks after controlled delays, records every completion request it receives and the
most requests it had in flight at once, and can fail chosen requests (HTTP 500 before streaming,
or an SSE error event after the first token). Use it in-process (``FakeOpenAIServer`` runs its own
event loop in a thread, so synchronous code that calls ``asyncio.run`` can talk to it) or as a
process: ``python fake_openai_server.py --port N`` (for ``peers_server.Server``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MODEL = "fake-model"


@dataclass
class Behaviour:
    first_token_delay: float = 0.02  # seconds from the request to the first token chunk
    token_delay: float = 0.005  # seconds between token chunks
    # overrides first_token_delay when set: seconds for this prompt given the earlier prompts
    first_token_delay_fn: Callable[[Any, list[Any]], float] | None = None
    eos_after: int | None = None  # tokens generated when the request does not set ignore_eos
    fail_every: int = 0  # every k-th completion request (1-based, warm-up included) gets HTTP 500
    error_midstream_every: int = 0  # every k-th completion request gets an SSE error after one token
    # how that error streams: "data" (data: {"error": {"message": ...}}), "text" (data: {"error": "..."}),
    # "field" (an SSE `error:` field, as older llama-server builds send, after which the stream just ends)
    error_style: str = "data"
    blank_token_at: int | None = None  # this token streams as "" (a held-back partial character)
    closing_chunk: bool = True  # an empty chunk with finish_reason after the last token, as many servers send
    usage: bool = True  # honour stream_options.include_usage


@dataclass
class Record:
    """What the server saw: completion request bodies in arrival order, peak concurrency."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0


def prompt_tokens(prompt: Any) -> int:
    return len(prompt) if isinstance(prompt, list) else len(str(prompt).split())


class _Handler:
    def __init__(self, behaviour: Behaviour, record: Record) -> None:
        self.b, self.rec = behaviour, record

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: several requests per connection
                line = await reader.readline()
                if not line.strip():
                    break
                method, path, _ = line.decode("latin-1").split(" ", 2)
                headers: dict[str, str] = {}
                while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    k, v = h.decode("latin-1").split(":", 1)
                    headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                await self.route(method, path, body, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def route(self, method: str, path: str, body: bytes, w: asyncio.StreamWriter) -> None:
        if method == "GET" and path == "/health":
            await self.json(w, 200, {"status": "ok"})
        elif method == "GET" and path == "/v1/models":
            await self.json(w, 200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        elif method == "POST" and path == "/v1/completions":
            await self.completion(json.loads(body), w)
        else:
            await self.json(w, 404, {"error": {"message": f"no route {method} {path}"}})

    async def json(self, w: asyncio.StreamWriter, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        w.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
                .encode() + data)
        await w.drain()

    async def completion(self, req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        earlier = [r["prompt"] for r in self.rec.requests]
        self.rec.requests.append(req)
        k = len(self.rec.requests)
        if self.b.fail_every and k % self.b.fail_every == 0:
            await self.json(w, 500, {"error": {"message": f"injected failure of request {k}"}})
            return
        self.rec.in_flight += 1
        self.rec.max_in_flight = max(self.rec.max_in_flight, self.rec.in_flight)
        try:
            await self.stream(req, k, earlier, w)
        finally:
            self.rec.in_flight -= 1

    async def stream(self, req: dict[str, Any], k: int, earlier: list[Any], w: asyncio.StreamWriter) -> None:
        b = self.b
        n = req["max_tokens"] if req.get("ignore_eos") or b.eos_after is None else min(req["max_tokens"], b.eos_after)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")

        async def event(obj: Any) -> None:
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            w.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await w.drain()

        def chunk(text: str, finish: str | None) -> dict[str, Any]:
            return {"id": f"cmpl-{k}", "object": "text_completion", "model": MODEL,
                    "choices": [{"index": 0, "text": text, "finish_reason": finish}], "usage": None}

        first = b.first_token_delay_fn(req["prompt"], earlier) if b.first_token_delay_fn else b.first_token_delay
        for i in range(n):
            await asyncio.sleep(first if i == 0 else b.token_delay)
            last = i == n - 1 and not b.closing_chunk
            await event(chunk("" if i == b.blank_token_at else f" t{i}", "length" if last else None))
            if b.error_midstream_every and k % b.error_midstream_every == 0:
                msg = f"injected stream error in request {k}"
                if b.error_style == "field":
                    data = f"error: {json.dumps({'code': 500, 'message': msg})}\n\n".encode()
                    w.write(f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n")
                    await w.drain()
                    return
                await event({"error": msg if b.error_style == "text" else {"message": msg}})
                break
        else:
            if b.closing_chunk:
                await event(chunk("", "length"))
            if b.usage and (req.get("stream_options") or {}).get("include_usage"):
                await event({"id": f"cmpl-{k}", "object": "text_completion", "model": MODEL, "choices": [],
                             "usage": {"prompt_tokens": prompt_tokens(req["prompt"]), "completion_tokens": n,
                                       "total_tokens": prompt_tokens(req["prompt"]) + n}})
        await event(b"[DONE]")
        w.write(b"0\r\n\r\n")
        await w.drain()


class FakeOpenAIServer:
    """In-process server on 127.0.0.1 (random free port); ``url`` and ``record`` while running."""

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.record = Record()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(_Handler(self.behaviour, self.record), "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._server.close()
        pending = asyncio.all_tasks(self._loop)
        for t in pending:
            t.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


async def _serve_forever(port: int, behaviour: Behaviour) -> None:
    server = await asyncio.start_server(_Handler(behaviour, Record()), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="fake OpenAI-compatible streaming server for tests")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--first-token-delay", type=float, default=0.02)
    p.add_argument("--token-delay", type=float, default=0.005)
    a = p.parse_args()
    asyncio.run(_serve_forever(a.port, Behaviour(first_token_delay=a.first_token_delay, token_delay=a.token_delay)))
