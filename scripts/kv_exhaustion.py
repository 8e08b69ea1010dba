"""KV exhaustion under load: a KV pool far too small for the offered load must preempt, never
crash or 5xx, and finish every request with a real finish_reason.

    python scripts/kv_exhaustion.py --kv-cache-gb 0.02 --concurrency 32 --requests 64

Starts its own loopback server with ``--kv-cache-gb`` (0.02 GiB is ~450 token slots for the
default model in float32, while c=32 requests of ~100 tokens each want ~3,000). Mixed
chat/completions, streaming and not. Checks: 0 5xx, 0 transport errors, every choice finished
with "length" or "stop", ``anycore_preemptions_total`` > 0, and afterwards 0 running and
0 KV slots held. Exit status 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serverkit import LiveServer, default_server_args, serve  # noqa: E402

WORDS = "river stone lantern orbit maple signal harbor velvet copper meadow thunder glass".split()


def one_request(srv: LiveServer, i: int) -> tuple[int | str, list[str | None]]:
    """Sends request ``i``; returns (status or error, finish_reasons)."""
    rng = random.Random(i)
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 60)))
    chat = i % 2 == 0
    stream = i % 3 == 0
    body: dict = {"max_tokens": rng.randint(32, 96), "ignore_eos": True, "temperature": 0.8, "seed": i,
                  "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = text
        path = "/v1/completions"
    try:
        if not stream:
            r = httpx.post(srv.url + path, json=body, headers=srv.headers, timeout=1800)
            if r.status_code != 200:
                return r.status_code, [r.text[:200]]
            return 200, [c["finish_reason"] for c in r.json()["choices"]]
        reasons: list[str | None] = []
        with httpx.stream("POST", srv.url + path, json=body, headers=srv.headers, timeout=1800) as r:
            if r.status_code != 200:
                return r.status_code, [r.read().decode()[:200]]
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    return "stream_error", [event["error"]["message"]]
                reasons += [c["finish_reason"] for c in event["choices"] if c.get("finish_reason")]
        return 200, reasons
    except httpx.HTTPError as e:
        return f"transport:{type(e).__name__}", [str(e)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kv-cache-gb", type=float, default=0.02)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=64)
    args = ap.parse_args()
    log = Path(tempfile.mkdtemp(prefix="anycore-kv-")) / "server.log"
    server_args = [*default_server_args(), "--kv-cache-gb", str(args.kv_cache_gb)]
    with serve(server_args, log) as srv:
        return _run(srv, args)


def _run(srv: LiveServer, args: argparse.Namespace) -> int:
    m0 = srv.metrics()
    t0 = time.monotonic()
    with ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(lambda i: one_request(srv, i), range(args.requests)))
    elapsed = time.monotonic() - t0
    deadline = time.monotonic() + 60
    while True:
        m = srv.metrics()
        if (m["anycore_num_requests_running"] == 0 and m["anycore_kv_slots_held"] == 0) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    statuses = Counter(str(s) for s, _ in results)
    reasons = Counter(r for s, rs in results if s == 200 for r in rs)
    bad = [(i, s, rs) for i, (s, rs) in enumerate(results)
           if s != 200 or not rs or any(r not in ("length", "stop") for r in rs)]
    preemptions = m["anycore_preemptions_total"] - m0["anycore_preemptions_total"]
    print(f"KV pool {m['anycore_kv_slots_total']:.0f} slots; {args.requests} requests at c={args.concurrency} "
          f"in {elapsed:.0f}s; statuses {dict(statuses)}; finish reasons {dict(reasons)}")
    print(f"preemptions {preemptions:.0f}; after: running {m['anycore_num_requests_running']:.0f}, "
          f"KV held {m['anycore_kv_slots_held']:.0f}; server alive {srv.alive()}")
    for item in bad[:10]:
        print("BAD", item)
    ok = not bad and preemptions > 0 and srv.alive() and m["anycore_kv_slots_held"] == 0
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
