"""Disconnect storm: hundreds of requests whose client goes away mid-way; afterwards nothing may
be left running and every KV slot a request held must be back.

    python scripts/disconnect_storm.py --streams 400 --concurrency 32

Each stream reads its first 1-6 SSE chunks and closes the connection; a share of non-streaming
requests has its socket closed while the answer is being generated. Then /metrics must show
0 running, 0 waiting, 0 queued and 0 KV slots held (the prefix cache may keep evictable slots:
``kv_slots_used - kv_slots_cached``), and a greedy probe must give the text it gave before.
Exit status 1 otherwise.
"""

from __future__ import annotations

import argparse
import random
import socket
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serverkit import LiveServer, default_server_args, probe_once, serve  # noqa: E402

PROMPTS = ["Write a long story about a lighthouse keeper.", "List every prime number you know.",
           "Explain how a steam engine works, in detail.", "Describe the history of Rome."]


def cut_stream(srv: LiveServer, i: int, rng: random.Random) -> int:
    """Streams a long completion, keeps 1-6 chunks, then drops the connection; returns chunks read."""
    path, body = (("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPTS[i % 4]}]})
                  if i % 2 else ("/v1/completions", {"prompt": PROMPTS[i % 4]}))
    body.update(max_tokens=400, ignore_eos=True, stream=True, n=1 + (i % 7 == 0))
    keep = rng.randint(1, 6)
    got = 0
    with httpx.stream("POST", srv.url + path, json=body, headers=srv.headers, timeout=300) as r:
        for _ in r.iter_bytes():
            got += 1
            if got >= keep:
                break
    return got


def cut_plain(srv: LiveServer, i: int, rng: random.Random) -> int:
    """A non-streaming request whose socket closes after a short while (before the answer)."""
    port = int(srv.url.rsplit(":", 1)[1])
    payload = f'{{"prompt": "{PROMPTS[i % 4]}", "max_tokens": 400, "ignore_eos": true}}'.encode()
    auth = "".join(f"{k}: {v}\r\n" for k, v in srv.headers.items())
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  + auth.encode() + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        time.sleep(rng.uniform(0.05, 1.0))
    return 0


def wait_idle(srv: LiveServer, seconds: float) -> tuple[dict[str, float], float]:
    t0 = time.monotonic()
    while True:
        m = srv.metrics()
        idle = (m["anycore_num_requests_running"] == 0 and m["anycore_num_requests_waiting"] == 0
                and m["anycore_num_requests_queued"] == 0 and m["anycore_kv_slots_held"] == 0)
        if idle or time.monotonic() - t0 > seconds:
            return m, time.monotonic() - t0
        time.sleep(0.2)


def storm(srv: LiveServer, streams: int, plain: int, concurrency: int, seed: int = 0) -> tuple[int, list[str]]:
    """Runs the cuts; returns (cuts done, errors other than the expected client-side close)."""
    rng = random.Random(seed)
    jobs = [(cut_stream, i) for i in range(streams)] + [(cut_plain, i) for i in range(plain)]
    rng.shuffle(jobs)
    errors: list[str] = []

    def run(job) -> None:
        fn, i = job
        try:
            fn(srv, i, random.Random(seed * 100_003 + i))
        except (httpx.HTTPError, OSError) as e:
            errors.append(f"{fn.__name__} {i}: {type(e).__name__}: {e}")

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(run, jobs))
    return len(jobs), errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url")
    ap.add_argument("--api-key")
    ap.add_argument("--streams", type=int, default=400)
    ap.add_argument("--plain", type=int, default=50, help="non-streaming requests cut by closing the socket")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--drain-timeout", type=float, default=120.0)
    args = ap.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    if args.url:
        return _run(LiveServer(args.url, headers=headers), args)
    log = Path(tempfile.mkdtemp(prefix="anycore-storm-")) / "server.log"
    with serve(default_server_args(), log) as srv:
        return _run(srv, args)


def _run(srv: LiveServer, args: argparse.Namespace) -> int:
    reference = probe_once(srv)
    idle_before, _ = wait_idle(srv, 30)
    t0 = time.monotonic()
    cuts, errors = storm(srv, args.streams, args.plain, args.concurrency)
    storm_s = time.monotonic() - t0
    m, drain_s = wait_idle(srv, args.drain_timeout)
    after = probe_once(srv)
    aborted = m.get('anycore_requests_finished_total{finish_reason="abort"}', 0.0)
    print(f"{cuts} requests cut ({args.streams} streams, {args.plain} non-streaming) in {storm_s:.0f}s at c={args.concurrency}; "
          f"client errors {len(errors)}")
    print(f"drained in {drain_s:.1f}s: running {m['anycore_num_requests_running']:.0f}, waiting "
          f"{m['anycore_num_requests_waiting']:.0f}, queued {m['anycore_num_requests_queued']:.0f}, KV held "
          f"{m['anycore_kv_slots_held']:.0f} (before {idle_before['anycore_kv_slots_held']:.0f}), KV used "
          f"{m['anycore_kv_slots_used']:.0f} = cached {m['anycore_kv_slots_cached']:.0f} of "
          f"{m['anycore_kv_slots_total']:.0f}; finished as abort: {aborted:.0f}")
    print(f"probe after the storm unchanged: {after == reference}; server alive: {srv.alive()}")
    for e in errors[:10]:
        print("ERROR", e)
    ok = (m["anycore_num_requests_running"] == 0 and m["anycore_num_requests_waiting"] == 0
          and m["anycore_num_requests_queued"] == 0 and m["anycore_kv_slots_held"] == 0
          and m["anycore_kv_slots_used"] == m["anycore_kv_slots_cached"] and after == reference
          and not errors and srv.alive())
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
