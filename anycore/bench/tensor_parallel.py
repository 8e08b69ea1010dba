"""`anycore bench tp`: what tensor parallel costs on this host.

- all-reduce latency of decode-sized tensors (``[rows, hidden]``) between ``--tp`` processes,
  over the shared-memory all-reduce and over gloo (loopback TCP), median of ``--iters`` calls
  after a warm-up;
- batch-1 greedy decode tokens/s at TP=1, TP=``--tp`` with shm and TP=``--tp`` with gloo on the
  same model and prompt.

On a host with fewer cores than a socket this shows overhead only (docs/TENSOR_PARALLEL.md
says what TP buys on a multi-socket server and why).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import statistics
import time

import torch

from anycore.config import EngineConfig

SHAPES = ((1, 576), (8, 576), (1, 4096), (32, 4096))  # SmolLM2-135M and a 7B-class width


def add_tp_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tp", type=int, default=2, help="ranks (default: %(default)s)")
    p.add_argument("--iters", type=int, default=200, help="all-reduce calls per shape (default: %(default)s)")
    p.add_argument("--output-len", type=int, default=48, help="decode tokens per run (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=2, help="decode runs per setting (default: %(default)s)")
    p.add_argument("--skip-decode", action="store_true", help="only the all-reduce latency")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")


def _allreduce_rank(rank: int, world: int, addr: str, iters: int, dtype: str, mode: str, out) -> None:
    from anycore.distributed.group import ParallelGroup

    torch.set_num_threads(1)
    group = ParallelGroup(rank, world, addr, 60.0, mode)
    results = {}
    for rows, width in SHAPES:
        t = torch.ones(rows, width, dtype=getattr(torch, dtype))
        for _ in range(max(10, iters // 10)):
            group.all_reduce(t)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            group.all_reduce(t)
            times.append(time.perf_counter() - t0)
        results[f"{rows}x{width}"] = statistics.median(times) * 1e6
    group.close()
    if rank == 0:
        out.put(results)


def allreduce_latency_us(world: int, iters: int, dtype: str = "float32", mode: str = "gloo") -> dict[str, float]:
    """Median microseconds per all-reduce (``mode`` shm or gloo), by ``rows x width``."""
    from anycore.distributed.driver import free_loopback_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    addr = f"127.0.0.1:{free_loopback_port()}"
    procs = [ctx.Process(target=_allreduce_rank, args=(r, world, addr, iters, dtype, mode, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = out.get(timeout=600)
    for p in procs:
        p.join(60)
    return results


def decode_tokens_per_s(config: EngineConfig, tp: int, output_len: int, repeats: int, all_reduce: str = "auto") -> float:
    """Best of ``repeats`` batch-1 greedy runs: generated tokens / wall time (prefill included,
    the prompt is short)."""
    from anycore import LLM, SamplingParams

    llm = LLM.from_config(dataclasses.replace(config, tensor_parallel_size=tp, dist_all_reduce=all_reduce))
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    best = 0.0
    try:
        llm.generate("Warm-up", SamplingParams(temperature=0, max_tokens=4))
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = llm.generate("The history of the printing press", params)[0]
            best = max(best, len(out.token_ids) / (time.perf_counter() - t0))
    finally:
        llm.close()
    return best


def run_tp(args: argparse.Namespace, config: EngineConfig) -> int:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    report: dict = {"tp": args.tp, "load_avg_1m": load[0], "allreduce_us": {}}
    for mode in ("shm", "gloo"):
        report["allreduce_us"][mode] = allreduce_latency_us(args.tp, args.iters, mode=mode)
    for name, per in report["allreduce_us"].items():
        print(f"all-reduce {name} (fp32, median us): " + ", ".join(f"{k} {v:.0f}" for k, v in per.items()))
    if not args.skip_decode:
        report["decode_tok_s"] = {"tp1": decode_tokens_per_s(config, 1, args.output_len, args.repeats)}
        for mode in ("shm", "gloo"):
            report["decode_tok_s"][f"tp{args.tp}-{mode}"] = decode_tokens_per_s(
                config, args.tp, args.output_len, args.repeats, mode)
        print("decode tok/s (batch 1, greedy, " + config.dtype + "): "
              + ", ".join(f"{k} {v:.1f}" for k, v in report["decode_tok_s"].items()))
    print(f"load average (1 min) at start: {load[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0
