"""Soak: c=32 mixed requests against a loopback `anycore serve` for a bounded time; the server's
RSS, sampled every 10 s, must stay flat and no request may fail.

    python scripts/soak.py --minutes 30 --concurrency 32 [--json out.json]

Mixed load: chat and completions, streaming and not, prompts of 5-300 words, 8-256 new tokens,
greedy and sampled, some n=2. Reports requests, errors, tokens, RSS first/last/max and the
least-squares RSS slope (MB/min) over the whole run and over its second half (after warm-up:
allocator pools and the prefix cache fill first). The slope limit for the exit status is
``--max-slope-mb-per-min`` over the second half (default 1.0). Exit status 1 on any error.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serverkit import LiveServer, default_server_args, rss_mb, serve, slope_per_minute  # noqa: E402

WORDS = ("the a of river stone lantern orbit maple signal harbor velvet copper meadow thunder glass "
         "engine winter garden number story answer question city mountain light").split()


def make_request(rng: random.Random) -> tuple[str, dict]:
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 300)))
    body: dict = {"max_tokens": rng.choice([8, 16, 32, 64, 128, 256]), "stream": rng.random() < 0.5}
    if rng.random() < 0.5:
        body["temperature"] = 0.0
    else:
        body.update(temperature=rng.uniform(0.5, 1.2), top_p=rng.choice([1.0, 0.9]), seed=rng.randrange(2**31))
    if rng.random() < 0.1:
        body["n"] = 2
    if body["stream"] and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    if rng.random() < 0.5:
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": text}]}
    return "/v1/completions", {**body, "prompt": text}


def one(client: httpx.Client, srv: LiveServer, path: str, body: dict) -> tuple[str | None, int]:
    """(error or None, completion tokens seen)."""
    try:
        if not body["stream"]:
            r = client.post(srv.url + path, json=body, headers=srv.headers, timeout=600)
            if r.status_code != 200:
                return f"HTTP {r.status_code}: {r.text[:200]}", 0
            data = r.json()
            if any(c["finish_reason"] not in ("length", "stop") for c in data["choices"]):
                return f"finish_reason {[c['finish_reason'] for c in data['choices']]}", 0
            return None, data["usage"]["completion_tokens"]
        chunks = 0
        done = False
        with client.stream("POST", srv.url + path, json=body, headers=srv.headers, timeout=600) as r:
            if r.status_code != 200:
                return f"HTTP {r.status_code}: {r.read()[:200]!r}", 0
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        return f"stream error: {event['error']['message']}", chunks
                    chunks += 1
        return (None if done else "stream ended without [DONE]"), chunks
    except (httpx.HTTPError, ValueError, KeyError) as e:
        return f"{type(e).__name__}: {e}", 0


def soak(srv: LiveServer, minutes: float, concurrency: int, sample_s: float = 10.0) -> dict:
    deadline = time.monotonic() + minutes * 60
    lock = threading.Lock()
    counts: Counter[str] = Counter()
    errors: list[str] = []
    tokens = [0]

    def worker(k: int) -> None:
        rng = random.Random(k)
        with httpx.Client() as client:
            while time.monotonic() < deadline:
                path, body = make_request(rng)
                err, n = one(client, srv, path, body)
                with lock:
                    counts[f"{path} stream={body['stream']}"] += 1
                    tokens[0] += n
                    if err is not None:
                        errors.append(err)

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(concurrency)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    samples: list[tuple[float, float]] = []
    loads: list[float] = []
    pid = srv.proc.pid if srv.proc is not None else None
    while time.monotonic() < deadline:
        if pid is not None:
            samples.append((time.monotonic() - t0, rss_mb(pid)))
        loads.append(os.getloadavg()[0])
        time.sleep(min(sample_s, max(0.0, deadline - time.monotonic())))
    for t in threads:
        t.join(timeout=660)  # a request already sent may take up to its own timeout
    if pid is not None:
        samples.append((time.monotonic() - t0, rss_mb(pid)))
    half = [s for s in samples if s[0] >= samples[-1][0] / 2] if samples else []
    return {
        "minutes": minutes, "concurrency": concurrency, "requests": sum(counts.values()), "by_kind": dict(counts),
        "errors": len(errors), "first_errors": errors[:10], "completion_tokens_or_chunks": tokens[0],
        "rss_samples": len(samples), "rss_first_mb": samples[0][1] if samples else None,
        "rss_last_mb": samples[-1][1] if samples else None, "rss_max_mb": max(v for _, v in samples) if samples else None,
        "rss_slope_mb_per_min": slope_per_minute(samples), "rss_slope_second_half_mb_per_min": slope_per_minute(half),
        "load_avg_1m_mean": sum(loads) / len(loads) if loads else None, "cpus": os.cpu_count(),
        "server_alive": srv.alive(), "rss_series": samples,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--sample-seconds", type=float, default=10.0)
    ap.add_argument("--max-slope-mb-per-min", type=float, default=1.0)
    ap.add_argument("--json", help="write the full report (with the RSS series) here")
    args = ap.parse_args()
    log = Path(tempfile.mkdtemp(prefix="anycore-soak-")) / "server.log"
    with serve(default_server_args(), log) as srv:
        report = soak(srv, args.minutes, args.concurrency, args.sample_seconds)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    summary = {k: v for k, v in report.items() if k != "rss_series"}
    print(json.dumps(summary, indent=1))
    ok = (report["errors"] == 0 and report["server_alive"]
          and report["rss_slope_second_half_mb_per_min"] <= args.max_slope_mb_per_min)
    print("PASS" if ok else "FAIL", f"(server log: {log})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
