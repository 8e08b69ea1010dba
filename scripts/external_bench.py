#!/usr/bin/env python3
"""Serving figures from an independent client, next to `anycore bench serving`'s, same servers.

The independent client is GuideLLM (the vLLM project's serving benchmark, PyPI `guidellm`),
installed into its own virtual environment so none of its dependencies touch this one (it
needs torch; the venv gets the pinned CPU build). For each server URL and concurrency it runs
GuideLLM (streaming /v1/completions, synthetic prompts of --prompt-tokens, --output-tokens
with ignore_eos), then `anycore bench serving` with the same shape, and prints both side by side.

    python scripts/external_bench.py --url anycore=http://127.0.0.1:8000 \\
        --url llama-server=http://127.0.0.1:8080 --concurrency 1 16 --json external.json

How the two clients count (the columns are named after these definitions):
- output tok/s: completion tokens (the server's usage count) / wall time of the level; GuideLLM
  reports it per level from its own timeline, ours from the first send to the last byte.
- TTFT: send -> first chunk carrying text.
- ITL: GuideLLM's inter_token_latency = (latency - TTFT) / (tokens - 1), per request; ours is
  the same quantity and is called TPOT in `anycore bench serving`.
- chunk gap: ours only, the time between consecutive text chunks (what `anycore bench serving`
  calls ITL); it equals the per-token figure only when every token arrives in its own chunk.
- GuideLLM's own TPOT = latency / tokens (TTFT included) is shown as `guidellm tpot`.
- sampling: GuideLLM sends no temperature, so servers sample at the OpenAI default of 1.0; ours
  is run at temperature 1.0 here too (`anycore bench serving` alone defaults to greedy, 0).

On a machine with as few cores as the server uses (the 2-core CI machines), GuideLLM's own
start-up (its synthetic-data worker) keeps a core busy for the first ~5 s of every level, so
the server has one core left for them: the first requests of a level run ~1.5x slower
(anycore bf16 at c=1: ITL 15 ms for the first two requests, 8.8-9.3 ms from the fifth on,
server CPU 100% then 196% of 200%). Hence 32 requests a level by default (at least 4 x the
concurrency), so the medians describe the steady state, and the `halves` printed after GuideLLM's
ITL: the median ITL of the requests that started in the first and in the second half of the level.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

GUIDELLM = "guidellm==0.8.1"
TORCH = "torch==2.13.0"  # the CPU build; an unpinned torch would pull a multi-GB CUDA build


def ensure_venv(path: Path) -> Path:
    """The venv's guidellm executable, creating the venv and installing into it if needed."""
    exe = path / "bin" / "guidellm"
    if exe.exists():
        return exe
    venv.create(path, with_pip=True)
    pip = [str(path / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, TORCH], check=True)
    subprocess.run([*pip, GUIDELLM], check=True)
    return exe


def export_tokenizer(model: str | None, out: Path) -> Path:
    """The served model's tokenizer as a Hugging Face folder (GuideLLM sizes its prompts with it)."""
    from transformers import AutoTokenizer

    from anycore.loader.default_model import default_model_path

    path = Path(model) if model else default_model_path()
    tok = (AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name) if path.is_file()
           else AutoTokenizer.from_pretrained(str(path)))
    tok.save_pretrained(out)
    return out


def model_id(url: str) -> str:
    import httpx

    return httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]


def median(metric: dict) -> float:
    return float(metric["successful"]["median"])


def run_guidellm(exe: Path, url: str, tokenizer: Path, concurrency: int, requests: int, prompt_tokens: int,
                 output_tokens: int, workdir: Path) -> dict[str, float]:
    out = workdir / f"guidellm-{abs(hash((url, concurrency)))}.json"
    cmd = [str(exe), "run",
           "--backend", f"kind=openai_http,target={url},model={model_id(url)},request_format=/v1/completions",
           "--profile", f"kind=concurrent,streams={concurrency}",
           "--constraint", f"kind=max_requests,count={requests}",
           "--data", f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={output_tokens}",
           "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
           "--output", f"kind=json,path={out}", "--disable-console"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    subprocess.run(cmd, check=True, env=env)
    bench = json.loads(out.read_text())["benchmarks"][0]
    m = bench["metrics"]
    by_start = sorted(bench["requests"]["successful"], key=lambda r: r["request_start_time"])
    half = len(by_start) // 2

    def itl_median(requests: list[dict]) -> float:
        return statistics.median(r["inter_token_latency_ms"] for r in requests)

    return {"output_tok_s": float(m["output_tokens_per_second"]["successful"]["mean"]),
            "ttft_ms": median(m["time_to_first_token_ms"]), "itl_ms": median(m["inter_token_latency_ms"]),
            "itl_first_half_ms": itl_median(by_start[:half] or by_start),
            "itl_second_half_ms": itl_median(by_start[half:]),
            "guidellm_tpot_ms": median(m["time_per_output_token_ms"]),
            "output_tokens": median(m["output_token_count"])}


def run_ours(url: str, concurrency: int, requests: int, prompt_tokens: int, output_tokens: int) -> dict[str, float]:
    import asyncio

    from anycore.bench import serving
    from anycore.bench.serve_workloads import serving_args

    args = serving_args(url, concurrency, requests, prompt_tokens, output_tokens, 0)
    args.temperature = 1.0  # what GuideLLM's requests get: they send none, and the OpenAI default is 1
    s = asyncio.run(serving.benchmark(args))
    return {"output_tok_s": s["output_throughput"], "ttft_ms": s["ttft_ms"]["p50"], "itl_ms": s["tpot_ms"]["p50"],
            "chunk_gap_ms": s["itl_ms"]["p50"], "output_tokens": s["total_output_tokens"] / max(1, s["completed"])}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", action="append", required=True, metavar="NAME=URL", help="a running server (repeatable)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    p.add_argument("--requests", type=int, default=None, help="requests per level (default: 4 x concurrency, >= 32)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--model", default=None, help="the served model's file/folder, for its tokenizer (default model)")
    p.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "anycore" / "guidellm-venv")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    targets = [u.split("=", 1) for u in args.url]
    exe = ensure_venv(args.venv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = export_tokenizer(args.model, Path(tmp) / "tokenizer")
        for c in args.concurrency:
            n = args.requests or max(32, 4 * c)
            for name, url in targets:  # interleaved: each level runs every server before the next level
                g = run_guidellm(exe, url, tokenizer, c, n, args.prompt_tokens, args.output_tokens, Path(tmp))
                o = run_ours(url, c, n, args.prompt_tokens, args.output_tokens)
                rows.append({"server": name, "concurrency": c, "guidellm": g, "anycore_bench": o})
                print(f"{name:>14} c={c:<3} | guidellm: {g['output_tok_s']:7.1f} tok/s  TTFT {g['ttft_ms']:7.1f} ms  "
                      f"ITL {g['itl_ms']:6.2f} ms (halves {g['itl_first_half_ms']:.2f} / "
                      f"{g['itl_second_half_ms']:.2f}) | anycore bench: {o['output_tok_s']:7.1f} tok/s  "
                      f"TTFT {o['ttft_ms']:7.1f} ms  ITL {o['itl_ms']:6.2f} ms  chunk gap {o['chunk_gap_ms']:6.2f} ms",
                      flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
