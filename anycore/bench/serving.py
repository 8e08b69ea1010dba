"""`anycore bench serving`: load-test any OpenAI-compatible server over streaming /v1/completions.

Requests go out at a fixed concurrency and/or a Poisson request rate; each is timed from send
to every streamed chunk, giving TTFT, inter-token latency (ITL), per-request time per output
token (TPOT) and end-to-end latency, plus throughput. Prompts are random token ids of a chosen
length (sent as a token array, which vLLM, SGLang and anycore accept; exact lengths, no prefix
sharing) or random words, or lines / JSONL ``{"prompt": ...}`` records from a file.

    python -m anycore.bench.serving --base-url http://127.0.0.1:8000 --concurrency 4 \\
        --num-prompts 16 --input-len 100 --output-len 128 --ignore-eos
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_WORDS = ("time year people way day man thing woman life child world school state family student group country "
          "problem hand part place case week company system program question work government number night point "
          "home water room mother area money story fact month lot right study book eye job word business issue "
          "side kind head house service friend father power hour game line end member law car city community").split()


@dataclass
class RequestResult:
    ok: bool = False
    prompt_len: int = 0  # as reported by the server's usage, else as sent
    output_len: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""


def add_serving_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("serving benchmark")
    g.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (with or without /v1)")
    g.add_argument("--model-name", default=None, help="model to request (default: the first of GET /v1/models)")
    g.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer <key>'")
    g.add_argument("--num-prompts", type=int, default=None, help="requests to send (default: 4 x concurrency, min 8)")
    g.add_argument("--concurrency", type=int, default=1, help="max requests in flight")
    g.add_argument("--request-rate", type=float, default=float("inf"),
                   help="Poisson arrival rate in req/s (default: all at once, bounded by --concurrency)")
    g.add_argument("--input-len", type=int, default=100, help="prompt length in tokens (random prompts)")
    g.add_argument("--output-len", type=int, default=128, help="max_tokens per request")
    g.add_argument("--range-ratio", type=float, default=0.0,
                   help="lengths drawn uniformly from [len*(1-r), len*(1+r)] (0: fixed lengths)")
    g.add_argument("--prompt-kind", choices=["ids", "words"], default="ids",
                   help="random token-id arrays (exact lengths) or random words (about one token each)")
    g.add_argument("--dataset-path", default=None,
                   help="prompts from a file: one per line, or JSONL with a 'prompt' field (overrides random)")
    g.add_argument("--token-id-range", default="1000:10000", help="random ids are drawn from lo:hi")
    g.add_argument("--ignore-eos", action="store_true", help="generate exactly --output-len tokens (vLLM extra)")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--warmup", type=int, default=1, help="untimed requests sent first")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    g.add_argument("--json-out", default=None, help="also write the results dict here")


def _lengths(n: int, mean: int, ratio: float, rng: random.Random) -> list[int]:
    lo, hi = max(1, int(mean * (1 - ratio))), max(1, int(mean * (1 + ratio)))
    return [rng.randint(lo, hi) for _ in range(n)]


def build_prompts(args: argparse.Namespace, n: int, rng: random.Random) -> list[tuple[Any, int]]:
    """(prompt, max_tokens) pairs; a prompt is a string or a list of token ids."""
    out_lens = _lengths(n, args.output_len, args.range_ratio, rng)
    if args.dataset_path:
        texts = []
        for line in Path(args.dataset_path).read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if not line:
                continue
            if line.startswith("{"):
                rec = json.loads(line)
                line = rec.get("prompt") or rec.get("text") or ""
            if line:
                texts.append(line)
        if not texts:
            raise ValueError(f"no prompts found in {args.dataset_path}")
        return [(texts[i % len(texts)], out_lens[i]) for i in range(n)]
    in_lens = _lengths(n, args.input_len, args.range_ratio, rng)
    if args.prompt_kind == "words":
        return [(" ".join(rng.choice(_WORDS) for _ in range(k)), m) for k, m in zip(in_lens, out_lens)]
    lo, hi = (int(x) for x in args.token_id_range.split(":"))
    return [([rng.randrange(lo, hi) for _ in range(k)], m) for k, m in zip(in_lens, out_lens)]


def _error_message(err: Any) -> str:
    """The message of a streamed error: ``{"message": ...}``, a JSON string of that, or plain text."""
    if isinstance(err, str):
        try:
            err = json.loads(err)
        except ValueError:
            return err
    if isinstance(err, dict):
        inner = err.get("error", err)
        return str(inner.get("message", inner) if isinstance(inner, dict) else inner)
    return str(err)


async def stream_completion(client: Any, url: str, body: dict[str, Any], timeout: float) -> RequestResult:
    """One streaming completion, timed from send to every token chunk; a failure is a result."""
    res = RequestResult(prompt_len=len(body["prompt"]) if isinstance(body["prompt"], list) else 0)
    t0 = time.perf_counter()
    last = t0
    chunks = 0
    try:
        async with client.stream("POST", url, json=body, timeout=timeout) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                return res
            async for line in r.aiter_lines():
                if line.startswith("error:"):  # older llama-server: an SSE `error` field, then the stream ends
                    res.error = _error_message(line[6:].strip())
                    return res
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    res.error = _error_message(obj["error"])
                    return res
                if obj.get("usage"):
                    res.prompt_len = obj["usage"].get("prompt_tokens", res.prompt_len)
                    res.output_len = obj["usage"].get("completion_tokens", chunks)
                if not obj.get("choices"):
                    continue
                now = time.perf_counter()
                if not (obj["choices"][0].get("text") or obj["choices"][0].get("finish_reason") is None):
                    continue  # an empty closing chunk carries no token
                if chunks == 0:
                    res.ttft = now - t0
                else:
                    res.itl.append(now - last)
                last = now
                chunks += 1
    except Exception as e:  # noqa: BLE001 - a failed request is a result, not a crash
        res.error = f"{type(e).__name__}: {e}"
        return res
    res.latency = time.perf_counter() - t0
    res.output_len = res.output_len or chunks
    res.ok = chunks > 0
    if not res.ok:
        res.error = "no tokens streamed"
    return res


def _pcts(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    s = sorted(values)

    def q(p: float) -> float:  # linear interpolation between closest ranks
        k = (len(s) - 1) * p
        f = int(k)
        c = min(f + 1, len(s) - 1)
        return s[f] + (s[c] - s[f]) * (k - f)

    return {"mean": statistics.fmean(s) * scale, "p50": q(0.5) * scale, "p90": q(0.9) * scale, "p99": q(0.99) * scale}


def summarize(results: list[RequestResult], duration: float, args: argparse.Namespace) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_len for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    tpot = [(r.latency - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1]
    return {
        "base_url": args.base_url, "concurrency": args.concurrency, "request_rate": args.request_rate,
        "completed": len(ok), "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration, "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_throughput": out_tokens / duration if duration else 0.0,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration else 0.0,
        "ttft_ms": _pcts([r.ttft for r in ok]),
        "itl_ms": _pcts([x for r in ok for x in r.itl]),
        "tpot_ms": _pcts(tpot),
        "e2e_latency_ms": _pcts([r.latency for r in ok]),
    }


def format_table(s: dict[str, Any]) -> str:
    rows = [
        ("Successful requests", f"{s['completed']}"), ("Failed requests", f"{s['failed']}"),
        ("Concurrency / request rate", f"{s['concurrency']} / {s['request_rate']}"),
        ("Benchmark duration (s)", f"{s['duration_s']:.2f}"),
        ("Total input tokens", f"{s['total_input_tokens']}"), ("Total output tokens", f"{s['total_output_tokens']}"),
        ("Request throughput (req/s)", f"{s['request_throughput']:.3f}"),
        ("Output token throughput (tok/s)", f"{s['output_throughput']:.2f}"),
        ("Total token throughput (tok/s)", f"{s['total_token_throughput']:.2f}"),
    ]
    for key, title in (("ttft_ms", "TTFT (ms)"), ("itl_ms", "ITL (ms)"), ("tpot_ms", "TPOT (ms)"),
                       ("e2e_latency_ms", "E2E latency (ms)")):
        v = s[key]
        rows.append((title, f"mean {v['mean']:.1f}  p50 {v['p50']:.1f}  p90 {v['p90']:.1f}  p99 {v['p99']:.1f}"))
    width = max(len(k) for k, _ in rows)
    lines = ["=" * 20 + " Serving benchmark " + "=" * 20]
    lines += [f"{k:<{width}}  {v}" for k, v in rows]
    if s["errors"]:
        lines.append(f"{'First errors':<{width}}  {s['errors']}")
    return "\n".join(lines)


async def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    rng = random.Random(args.seed)
    root = args.base_url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    n = args.num_prompts or max(8, 4 * args.concurrency)
    limits = httpx.Limits(max_connections=max(args.concurrency, 1) + 1, max_keepalive_connections=args.concurrency + 1)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=args.timeout) as client:
        model = args.model_name
        if model is None:
            r = await client.get(f"{root}/v1/models")
            r.raise_for_status()
            model = r.json()["data"][0]["id"]
        url = f"{root}/v1/completions"

        def body(prompt: Any, max_tokens: int) -> dict[str, Any]:
            b = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": args.temperature,
                 "stream": True, "stream_options": {"include_usage": True}}
            if args.ignore_eos:
                b["ignore_eos"] = True
            return b

        for prompt, max_tokens in build_prompts(args, args.warmup, random.Random(args.seed + 1)):
            w = await stream_completion(client, url, body(prompt, max_tokens), args.timeout)
            if not w.ok:
                raise RuntimeError(f"warm-up request failed: {w.error}")
        work = build_prompts(args, n, rng)
        sem = asyncio.Semaphore(max(args.concurrency, 1))

        async def limited(prompt: Any, max_tokens: int) -> RequestResult:
            async with sem:
                return await stream_completion(client, url, body(prompt, max_tokens), args.timeout)

        tasks = []
        start = time.perf_counter()
        for i, (prompt, max_tokens) in enumerate(work):
            # Poisson gaps between arrivals only: a gap after the last one would idle into the duration
            if i and args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
            tasks.append(asyncio.create_task(limited(prompt, max_tokens)))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    summary = summarize(list(results), duration, args)
    summary["model"] = model
    summary["num_prompts"] = n
    summary["input_len"], summary["output_len"] = args.input_len, args.output_len
    return summary


def run_serving(args: argparse.Namespace) -> int:
    """Checks the arguments, runs the load, prints the table (and writes ``--json-out``)."""
    from anycore.bench.checks import check_serving
    from anycore.bench.report import write_json_atomic

    json_path = check_serving(args)
    summary = asyncio.run(benchmark(args))
    print(format_table(summary))
    if json_path is not None:
        write_json_atomic(summary, json_path)
    return 0 if summary["completed"] and not summary["failed"] else 1


def main(argv: list[str] | None = None) -> int:
    from anycore.bench.checks import BenchArgumentError

    p = argparse.ArgumentParser(prog="python -m anycore.bench.serving", description=__doc__.split("\n\n")[0])
    add_serving_args(p)
    try:
        return run_serving(p.parse_args(argv))
    except BenchArgumentError as e:
        p.exit(2, f"{p.prog}: error: {e}\n")


if __name__ == "__main__":
    sys.exit(main())

