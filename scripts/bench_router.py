"""Replicas behind the router: what the router costs per request, and what cache-aware routing
gains in prefix-cache hits over round robin.

    python scripts/bench_router.py [--replicas 2] [--groups 4] [--per-group 6] [--json out.json]

Starts N replica servers (as `anycore serve --data-parallel-size N` does: loopback ports, CPUs
split between them) and two routers over the same replicas, one cache_aware and one round_robin.

1. Overhead: GET /v1/models (the hop alone) and a small completion (1 greedy token of a short
   prompt) sent one at a time, direct to replica 0 and through each router, interleaved; median
   and p90 latency of each path.
2. Prefix hits: G groups of requests, each group sharing a long prefix (~500 tokens) and differing
   in the question at the end, sent G at a time in a shuffled order; per policy, the replicas'
   cached / prompt tokens (their /metrics) and which replica served how many. Each policy gets
   prefixes of its own, so one run's cache does not help the other.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from anycore.server.replicas import ReplicaSet, free_port  # noqa: E402

WORDS = ("river stone cloud music paper light garden window silver forest engine ocean market "
         "bridge candle harbor meadow lantern orchard valley").split()


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def counts(urls: list[str]) -> list[tuple[float, float, float]]:
    """Per replica: (requests, prompt tokens, cached prompt tokens)."""
    out = []
    for url in urls:
        v = {}
        for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, _, value = line.rpartition(" ")
                v[name] = float(value)
        out.append((v["anycore_requests_received_total"], v["anycore_prompt_tokens_total"],
                    v["anycore_cached_prompt_tokens_total"]))
    return out


def complete(client: httpx.Client, url: str, prompt: str) -> float:
    t0 = time.perf_counter()
    r = client.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 1, "temperature": 0})
    r.raise_for_status()
    return time.perf_counter() - t0


def list_models(client: httpx.Client, url: str, prompt: str) -> float:
    t0 = time.perf_counter()
    client.get(f"{url}/v1/models").raise_for_status()
    return time.perf_counter() - t0


def overhead(paths: dict[str, str], n: int) -> dict[str, dict[str, float]]:
    """Per path and request kind: GET /v1/models (no engine work: the hop itself) and a 1-token
    completion (the hop plus what the router does per inference request)."""
    out = {}
    with httpx.Client(timeout=120) as client:
        for kind, call in (("models", list_models), ("completion", complete)):
            lat: dict[str, list[float]] = {name: [] for name in paths}
            for url in paths.values():  # warm each path (connections, the router's tables)
                call(client, url, "Hello there")
            for i in range(n):
                for name, url in paths.items():
                    lat[name].append(call(client, url, f"Hello there, number {i % 5}"))
            for name, v in lat.items():
                v.sort()
                out[f"{kind} {name}"] = {"median_ms": 1e3 * statistics.median(v), "p90_ms": 1e3 * v[int(0.9 * (n - 1))]}
    return out


def prefix_run(router: str, replicas: list[str], groups: int, per_group: int, seed: int) -> dict:
    rng = random.Random(seed)
    prefixes = [f"Report {seed}-{g}: " + " ".join(rng.choice(WORDS) for _ in range(480)) for g in range(groups)]
    # shuffled: in a fixed interleaved order round robin would send each group to one replica
    # whenever the group count is a multiple of the replica count
    order = [(g, q) for q in range(per_group) for g in range(groups)]
    rng.shuffle(order)
    before = counts(replicas)
    t0 = time.perf_counter()
    with httpx.Client(timeout=300) as client, ThreadPoolExecutor(groups) as pool:
        list(pool.map(lambda gq: complete(client, router, f"{prefixes[gq[0]]}\nQuestion {gq[1]}: why?"), order))
    wall = time.perf_counter() - t0
    after = counts(replicas)
    per = [tuple(a - b for a, b in zip(x, y)) for x, y in zip(after, before)]
    prompt, cached = sum(p[1] for p in per), sum(p[2] for p in per)
    return {"requests": len(order), "wall_s": wall, "prompt_tokens": prompt, "cached_tokens": cached,
            "hit_rate": cached / prompt if prompt else 0.0, "requests_per_replica": [int(p[0]) for p in per]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--per-group", type=int, default=6)
    ap.add_argument("--overhead-requests", type=int, default=60)
    ap.add_argument("--kv-cache-gb", default="0.1")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    rs = ReplicaSet()
    routers = {p: ReplicaSet() for p in ("cache_aware", "round_robin")}  # each holds one router only
    try:
        rs.start_replicas(["--log-level", "WARNING", "serve", "--kv-cache-gb", args.kv_cache_gb,
                           "--max-model-len", "2048", "--no-self-check"], args.replicas)
        rs.wait_ready(900)
        replicas = [c.url for c in rs.replicas]
        urls = {}
        for p, r in routers.items():
            r.replicas = rs.replicas
            urls[p] = r.start_router("127.0.0.1", free_port(), p)
            r.replicas = []
        result: dict = {"load_before": load(), "replicas": args.replicas, "cpus": os.cpu_count()}
        result["overhead"] = overhead({"direct": replicas[0], **{f"router {p}": u for p, u in urls.items()}},
                                      args.overhead_requests)
        result["prefix"] = {p: prefix_run(u, replicas, args.groups, args.per_group, seed)
                            for seed, (p, u) in enumerate(urls.items())}
        result["load_after"] = load()
    finally:
        for r in routers.values():
            r.stop(10)
        rs.stop(20)
    print(f"load before: {result['load_before']}")
    for name, v in result["overhead"].items():
        print(f"{name:32s} median {v['median_ms']:7.2f} ms   p90 {v['p90_ms']:7.2f} ms")
    for p, v in result["prefix"].items():
        print(f"{p:12s} hit rate {v['hit_rate']:6.1%} ({v['cached_tokens']:.0f}/{v['prompt_tokens']:.0f} prompt tokens "
              f"cached)  {v['requests']} requests in {v['wall_s']:.1f}s  per replica {v['requests_per_replica']}")
    print(f"load after: {result['load_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
