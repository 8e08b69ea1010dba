"""Micro-benchmark: every usable implementation of each kernel op on Llama-8B-like shapes.

    python -m anycore.bench.kernels [--dtype bf16] [--threads N] [--quick]

``bench_kernels()`` returns ``{case: {impl: microseconds}}``; not a test, numbers vary by host.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

from anycore.kernels import reference
from anycore.kernels.dispatch import implementations, make_op


def _time_us(fn, args, min_time: float = 0.2, warmup: int = 3, clock=time.perf_counter) -> float:
    """Best of three windows of >= min_time/3 each, in microseconds per call."""
    for _ in range(warmup):
        fn(*args)
    best = float("inf")
    for _ in range(3):
        n, t0 = 0, clock()
        while True:
            fn(*args)
            n += 1
            elapsed = clock() - t0
            if elapsed >= min_time / 3:
                best = min(best, elapsed / n * 1e6)
                break
    return best


def _attn_args(batch: int, ctx: int, new: int, heads: int, kv_heads: int, d: int, dtype):
    slots = batch * ctx
    k = torch.randn(slots, kv_heads, d, dtype=dtype)
    v = torch.randn(slots, kv_heads, d, dtype=dtype)
    table = torch.randperm(slots).view(batch, ctx).to(torch.int32)
    q = torch.randn(batch * new, heads, d, dtype=dtype)
    q_start = torch.arange(0, batch * new + 1, new, dtype=torch.int64)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int64)
    return q, k, v, q_start, seq_lens, table, 1 / math.sqrt(d)


def cases(dtype: torch.dtype, quick: bool = False) -> dict[str, tuple[str, tuple]]:
    h, inter, heads, kvh, d = 4096, 14336, 32, 8, 128
    toks = (1, 64) if quick else (1, 64, 512)
    out: dict[str, tuple[str, tuple]] = {}
    w = torch.randn(h, dtype=dtype)
    for t in toks:
        x = torch.randn(t, h, dtype=dtype)
        out[f"rms_norm t={t}"] = ("rms_norm", (x, w, 1e-6))
        out[f"add_rms_norm t={t}"] = ("add_rms_norm", (x, torch.randn_like(x), w, 1e-6))
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
        cos, sin = reference.rotary_cos_sin(inv, torch.arange(t))
        out[f"apply_rotary q t={t}"] = ("apply_rotary", (torch.randn(t, heads * d, dtype=dtype), cos, sin, d))
        out[f"silu_and_mul t={t}"] = ("silu_and_mul", (torch.randn(t, 2 * inter, dtype=dtype),))
    out["attn decode b=1 ctx=1024"] = ("paged_attention", _attn_args(1, 1024, 1, heads, kvh, d, dtype))
    out["attn decode b=8 ctx=512"] = ("paged_attention", _attn_args(8, 512, 1, heads, kvh, d, dtype))
    if not quick:
        out["attn decode b=4 ctx=4096"] = ("paged_attention", _attn_args(4, 4096, 1, heads, kvh, d, dtype))
        out["attn prefill b=1 n=512"] = ("paged_attention", _attn_args(1, 512, 512, heads, kvh, d, dtype))
    return out


def bench_kernels(dtype: torch.dtype = torch.bfloat16, threads: int | None = None,
                  quick: bool = False, cpu_time: bool = False) -> dict[str, dict[str, float]]:
    """``cpu_time``: process CPU time instead of wall time (steadier on a shared machine;
    with several threads it sums them)."""
    clock = time.process_time if cpu_time else time.perf_counter
    if threads:
        torch.set_num_threads(threads)
    results: dict[str, dict[str, float]] = {}
    impl_cache: dict[str, list[str]] = {}
    for name, (op, args) in cases(dtype, quick).items():
        if op not in impl_cache:
            impl_cache[op] = [impl for impl, why in implementations(op) if not why]
        results[name] = {impl: round(_time_us(make_op(op, impl), args, clock=clock), 1) for impl in impl_cache[op]}
    return results


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m anycore.bench.kernels")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--cpu-time", action="store_true", help="measure process CPU time (shared machines)")
    a = p.parse_args(argv)
    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    res = bench_kernels(dtype, a.threads, a.quick, a.cpu_time)
    if a.json:
        print(json.dumps(res, indent=1))
        return
    impls = sorted({i for r in res.values() for i in r}, key=lambda i: (i != "torch-native", i))
    print(f"{'case (us, ' + a.dtype + ', threads=' + str(torch.get_num_threads()) + ')':<36}"
          + "".join(f"{i:>13}" for i in impls))
    for name, r in res.items():
        print(f"{name:<36}" + "".join(f"{r.get(i, float('nan')):>13.1f}" for i in impls))


if __name__ == "__main__":
    main()
