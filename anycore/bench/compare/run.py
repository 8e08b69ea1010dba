"""`anycore bench compare` from checked flags to the table: the physical limits first, then the
offline, memory and HTTP workloads (those asked for, in that order), the JSON after each."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from typing import Any

from anycore.bench import hardware, report
from anycore.bench.compare.args import OFFLINE_WORKLOADS, SERVING_WORKLOADS, apply_quick, check_compare
from anycore.bench.compare.context import CompareContext, ResultLog
from anycore.bench.load import LoadMonitor, top_other_processes, wait_for_quiet
from anycore.bench.peers.gguf_files import prefill_flops_per_token
from anycore.config import EngineConfig


def prepare(args: argparse.Namespace, config: EngineConfig) -> CompareContext:
    """Checks every flag (``BenchArgumentError`` on a bad one); nothing is loaded or measured."""
    apply_quick(args)
    inputs = check_compare(args, config)
    config = replace(config, threads=config.threads or os.cpu_count() or 1)
    return CompareContext(args, config, inputs, ResultLog(inputs.out, args))


def measure_limits(ctx: CompareContext) -> dict[str, Any]:
    """Read bandwidth and peak GEMM (again while other processes were busy, up to
    ``--retry-noisy`` times): the limits of the cells (the JSON's hardware record too)."""
    import torch

    a = ctx.args
    torch.set_num_threads(ctx.threads)
    busiest = top_other_processes()
    ctx.log(f"model {ctx.inputs.model}, {ctx.threads} threads; busiest other processes now (cores): {busiest}")
    for _ in range(1 + max(0, a.retry_noisy)):  # the limits are as load-sensitive as the cells
        wait_for_quiet(a.noise_cores, a.quiet_wait)
        with LoadMonitor() as mon:
            bw = hardware.memory_bandwidth(ctx.threads, ctx.inputs.cache_dir)
            peak = hardware.peak_gemm(ctx.threads)
        if mon.report.other_cores <= a.noise_cores:
            break
        ctx.log(f"limits measured while others used {mon.report.other_cores:.2f} cores; measuring again")
    ctx.log(f"read bandwidth {bw['gb_s']:.1f} GB/s; peak GEMM {peak} (others {mon.report.other_cores:.2f} cores)")
    flops_tok = prefill_flops_per_token(ctx.inputs.model, a.prefill_tokens)
    limits = {"bandwidth_gb_s": bw["gb_s"], "peak": peak, "prefill_flops_per_token": flops_tok}
    record = {"bandwidth": bw, "peak_gemm_tflops": peak, "load": mon.report.as_dict(),
              "prefill_flops_per_token": flops_tok}
    ctx.results.start(ctx.inputs.model, ctx.threads, ctx.config.quantization, busiest, record)
    return limits


def run_phases(ctx: CompareContext, limits: dict[str, Any]) -> None:
    from anycore.bench.compare import memory_phase, offline_phase, serve_phase

    gguf, workloads = ctx.inputs.model, ctx.inputs.workloads
    if any(w in workloads for w in OFFLINE_WORKLOADS):
        offline_phase.run_offline(ctx, gguf, limits)
    if "memory" in workloads:
        memory_phase.run_memory(ctx, gguf)
    if any(w in workloads for w in SERVING_WORKLOADS):
        serve_phase.run_serving(ctx, gguf)


def execute(ctx: CompareContext) -> dict[str, Any]:
    """Limits and workloads; on any failure (an interrupt too) the cells measured so far are
    written with the error before it propagates."""
    limits = measure_limits(ctx)
    try:
        run_phases(ctx, limits)
    except BaseException as e:
        ctx.results.checkpoint(error=f"{type(e).__name__}: {e}")
        ctx.log(f"stopped by {type(e).__name__}; the cells measured so far are in {ctx.inputs.out}")
        raise
    return ctx.results.finish()


def run_compare(args: argparse.Namespace, config: EngineConfig) -> int:
    ctx = prepare(args, config)
    result = execute(ctx)
    out = ctx.inputs.out
    print(report.format_table(result))
    print(f"\nJSON: {out}")
    try:
        from anycore.bench.charts import write_charts

        for p in write_charts(result, out.with_suffix("")):
            print(f"chart: {p}")
    except ImportError:
        print("charts skipped: matplotlib not installed (pip install -e .[bench])")
    return 0
