"""`anycore bench latency | throughput`: the engine in-process, no HTTP.

latency:    batch-1 decode tok/s (128 tokens after a short prompt) and prefill tok/s (one
            512-token prompt), each the median of ``--repeats`` runs.
throughput: ``--num-prompts`` requests of ``--input-len`` tokens each generating
            ``--output-len`` tokens, all submitted at once; output and total tok/s.
Prompts are random token ids (seeded) so no run is a prefix-cache hit of another.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from anycore.bench.checks import check_offline
from anycore.bench.report import write_json_atomic
from anycore.config import EngineConfig
from anycore.engine.engine import Engine
from anycore.sampling_params import SamplingParams

# draws a prompt of n token ids; `anycore bench compare` passes one shared by every engine
PromptSource = Callable[[int], list[int]]


def vocab_prompts(rng: random.Random, vocab: int) -> PromptSource:
    # skip the low ids (special tokens in most vocabularies)
    return lambda n: [rng.randrange(256, vocab) for _ in range(n)]


def _drain(engine: Engine) -> None:
    while engine.has_unfinished():
        engine.step()


def measure_prefill(engine: Engine, prompt_len: int, prompts: PromptSource) -> float:
    """tok/s of prefilling one prompt (all of it in as few steps as the budget allows)."""
    prompt = prompts(prompt_len)
    engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    t0 = time.perf_counter()
    _drain(engine)
    return prompt_len / (time.perf_counter() - t0)


def measure_decode(engine: Engine, decode_tokens: int, prompts: PromptSource, batch: int = 1) -> float:
    """Output tok/s of ``batch`` requests decoding together, after their prefill is done."""
    params = SamplingParams(temperature=0, max_tokens=decode_tokens + 1, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(prompts(16), params)
    produced = 0
    while produced < batch:  # until every request has its first token (prefill finished)
        produced += len(engine.step())
    t0 = time.perf_counter()
    produced = 0
    while engine.has_unfinished():  # (a step may return several tokens of a request: a decode burst)
        produced += sum(len(o.new_token_ids) for o in engine.step())
    return produced / (time.perf_counter() - t0)


def measure_throughput(engine: Engine, num_prompts: int, input_len: int, output_len: int,
                       prompts: PromptSource) -> dict:
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    for _ in range(num_prompts):
        engine.add_request(prompts(input_len), params)
    t0 = time.perf_counter()
    _drain(engine)
    dt = time.perf_counter() - t0
    return {
        "output_tok_s": num_prompts * output_len / dt,
        "total_tok_s": num_prompts * (input_len + output_len) / dt,
        "seconds": dt,
    }


def run_latency(config: EngineConfig, prompt_len: int, decode_tokens: int, repeats: int, seed: int = 0) -> dict:
    engine = Engine(replace(config.for_offline(), max_num_batched_tokens=max(config.max_num_batched_tokens, prompt_len)))
    prompts = vocab_prompts(random.Random(seed), engine.model_config.vocab_size)
    measure_decode(engine, 8, prompts)  # warm-up (allocator, kernels, caches)
    prefill = [measure_prefill(engine, prompt_len, prompts) for _ in range(repeats)]
    decode = [measure_decode(engine, decode_tokens, prompts) for _ in range(repeats)]
    return {
        "dtype": config.dtype,
        "kernels": dict(engine.ops.choices),
        "prefill_tok_s": statistics.median(prefill),
        "prefill_runs": prefill,
        "decode_tok_s": statistics.median(decode),
        "decode_runs": decode,
        "prompt_len": prompt_len,
        "decode_tokens": decode_tokens,
        "weight_bytes": engine.weight_bytes,  # read per batch-1 decode token
    }


def run_throughput(config: EngineConfig, num_prompts: int, input_len: int, output_len: int, repeats: int,
                   seed: int = 0) -> dict:
    engine = Engine(config.for_offline())
    prompts = vocab_prompts(random.Random(seed), engine.model_config.vocab_size)
    measure_decode(engine, 4, prompts)  # warm-up
    runs = [measure_throughput(engine, num_prompts, input_len, output_len, prompts) for _ in range(repeats)]
    return {
        "dtype": config.dtype,
        "num_prompts": num_prompts,
        "input_len": input_len,
        "output_len": output_len,
        "output_tok_s": statistics.median(r["output_tok_s"] for r in runs),
        "total_tok_s": statistics.median(r["total_tok_s"] for r in runs),
        "runs": runs,
    }


def _dtypes(value: str) -> list[str]:
    return ["bfloat16", "float32"] if value == "both" else [value]


def bench_offline(kind: str, args: Any, config: EngineConfig) -> int:
    """Runs ``kind`` (latency | throughput) per dtype, arguments checked first; with ``--json``
    the results so far are written after each dtype, so a failure in a later one keeps the
    earlier numbers."""
    json_path = check_offline(kind, args)
    results: list[dict[str, Any]] = []
    for dtype in _dtypes(args.bench_dtype):
        cfg = replace(config, dtype=dtype)
        if kind == "latency":
            r = run_latency(cfg, args.input_len, args.output_len, args.repeats)
            print(f"[{dtype}] batch-1 decode {r['decode_tok_s']:.1f} tok/s   prefill({args.input_len}) "
                  f"{r['prefill_tok_s']:.1f} tok/s   (median of {args.repeats})")
        else:
            r = run_throughput(cfg, args.num_prompts, args.input_len, args.output_len, args.repeats)
            print(f"[{dtype}] {args.num_prompts} prompts x ({args.input_len} in, {args.output_len} out): "
                  f"{r['output_tok_s']:.1f} output tok/s, {r['total_tok_s']:.1f} total tok/s")
        results.append(r)
        if json_path is not None:
            write_json_atomic(results, json_path)
    return 0
