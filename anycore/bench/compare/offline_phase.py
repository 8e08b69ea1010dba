"""The in-process workloads of `anycore bench compare`: decode, prefill and batch.

Every engine loads once; then per workload the engines take turns (A B C A B C ...) for
``--repeats`` rounds on the same prompts. A repeat during which other processes kept more than
``--noise-cores`` busy is measured again (``--retry-noisy``) on fresh prompts; decode's limit is
the read bandwidth probed again before each of its rounds.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from anycore.bench import hardware
from anycore.bench.compare.args import OFFLINE_WORKLOADS, WORKLOADS
from anycore.bench.compare.context import CompareContext
from anycore.bench.load import LoadMonitor, wait_for_quiet
from anycore.bench.peers.anycore_runner import AnycoreRunner
from anycore.bench.peers.base import PeerUnavailable, Runner
from anycore.bench.peers.gguf_files import gguf_variant
from anycore.bench.peers.llama_cpp import LlamaCppRunner
from anycore.bench.peers.transformers_runner import TransformersRunner
from anycore.bench.stats import interleave

Job = Callable[[Runner, random.Random], "float | None"]


def load_runners(ctx: CompareContext, gguf: Path) -> list[Runner]:
    """Every offline engine of the run that loads; the others are recorded as skipped."""
    runners: list[Runner] = []

    def attempt(name: str, make: Callable[[], Runner]) -> None:
        ctx.log(f"loading {name}")
        try:
            runners.append(make())
            ctx.results.engines[name] = {"weight_bytes": runners[-1].weight_bytes, **runners[-1].info}
        except PeerUnavailable as e:
            ctx.results.skip(name, str(e))
        except Exception as e:  # noqa: BLE001 - a broken peer is reported, the others still run
            ctx.results.skip(name, f"failed to load: {type(e).__name__}: {e}")

    for name, config in ctx.anycore_engines(offline=True):
        attempt(name, lambda name=name, config=config: AnycoreRunner(name, config))
    if "llama-cpp" in ctx.inputs.peers:
        for qt in ctx.inputs.gguf_types:
            attempt(f"llama.cpp {qt}", lambda qt=qt: LlamaCppRunner(
                f"llama.cpp {qt}", gguf_variant(gguf, qt, ctx.inputs.cache_dir / "gguf"), ctx.threads))
    if "transformers" in ctx.inputs.peers:
        for dt in ctx.inputs.hf_dtypes:
            attempt(f"transformers {dt}", lambda dt=dt: TransformersRunner(f"transformers {dt}", gguf, dt, ctx.threads))
    return runners


def jobs(ctx: CompareContext) -> dict[str, tuple[str, Job]]:
    """Per offline workload: its row title and what one repeat measures (tok/s)."""
    a = ctx.args
    return {
        "decode": (f"decode b=1 ({a.decode_tokens} tok)", lambda r, rng: r.decode(a.decode_tokens, rng)),
        "prefill": (f"prefill {a.prefill_tokens}", lambda r, rng: r.prefill(a.prefill_tokens, rng)),
        "batch": (f"batch {a.batch_prompts}x({a.batch_input_len}+{a.batch_output_len})",
                  lambda r, rng: r.batch(a.batch_prompts, a.batch_input_len, a.batch_output_len, rng)),
    }


def run_offline(ctx: CompareContext, gguf: Path, limits: dict[str, Any]) -> None:
    """All offline workloads of the run; the JSON is rewritten after each."""
    runners = load_runners(ctx, gguf)
    try:
        for wl in (w for w in OFFLINE_WORKLOADS if w in ctx.inputs.workloads):
            title, fn = jobs(ctx)[wl]
            measure_workload(ctx, wl, title, fn, runners, limits)
            ctx.results.checkpoint()
    finally:
        for r in runners:
            r.close()


def measure_workload(ctx: CompareContext, wl: str, title: str, fn: Job, runners: list[Runner],
                     limits: dict[str, Any]) -> None:
    a = ctx.args
    vals: dict[str, list[float]] = {r.name: [] for r in runners}
    loads: dict[str, list[dict[str, float]]] = {r.name: [] for r in runners}
    discarded: dict[str, int] = {r.name: 0 for r in runners}
    round_bw: list[float] = []  # decode: the read bandwidth again before each round
    for rep, runner in interleave(runners, a.repeats):  # A B C A B C ...
        if wl == "decode" and limits.get("bandwidth_gb_s") and runner is runners[0]:
            round_bw.append(_round_bandwidth(ctx, rep))
        for attempt in range(1 + max(0, a.retry_noisy)):
            time.sleep(a.settle)
            wait_for_quiet(a.noise_cores, a.quiet_wait)
            # same prompts for every engine; new ones for each workload and retry (anycore's
            # prefix cache holds every earlier prompt: the decode prompt would be the first
            # 16 tokens of the prefill one, a discarded attempt's the whole of it)
            seed = 10_000 * rep + 7 + 101 * WORKLOADS.index(wl) + 1_000_003 * attempt
            with LoadMonitor() as mon:
                v = fn(runner, random.Random(seed))
            others = mon.report.other_cores
            if v is not None and others > a.noise_cores and attempt < a.retry_noisy:
                discarded[runner.name] += 1
                ctx.log(f"{title} [{rep}] {runner.name}: {v:.1f} tok/s discarded (others {others:.2f} cores)")
                continue
            break
        if v is None:
            continue
        vals[runner.name].append(v)
        loads[runner.name].append(mon.report.as_dict())
        ctx.log(f"{title} [{rep}] {runner.name}: {v:.1f} tok/s (others {mon.report.other_cores:.2f} cores)")
    for r in runners:
        if not vals[r.name]:
            continue
        limit = None
        extra: dict[str, Any] = {}
        if wl == "decode" and limits.get("bandwidth_gb_s"):
            # the bandwidth the host gave during these rounds, not only at the start
            bw = statistics.median(round_bw) if round_bw else limits["bandwidth_gb_s"]
            limit = bw * 1e9 / r.weight_bytes
            extra = {"bandwidth_gb_s": bw, "bandwidth_rounds_gb_s": round_bw}
        elif wl == "prefill" and (peak := prefill_peak(limits.get("peak", {}), r.dtype_class)):
            limit = peak * 1e12 / limits["prefill_flops_per_token"]
        ctx.results.add(title, r.name, "tok/s", True, vals[r.name], loads[r.name], limit,
                        dtype_class=r.dtype_class, weight_bytes=r.weight_bytes, discarded_noisy=discarded[r.name],
                        **extra)


# The GEMMs a prefill of each class may run on: its own, and the wider float types. Where the
# host has no fast GEMM of the class, anycore computes in a wider one: on an AVX2-only CPU torch's
# bf16 and int8 GEMMs run at a few GFLOP/s, so bf16 is widened to fp32 (kernels/onednn.py) and
# GGUF blocks are dequantized for a float GEMM. A limit from the class's own GEMM alone would then
# sit below the measured rate (a "fraction of limit" of 100x).
_PREFILL_GEMMS = {"fp32": ("fp32",), "bf16": ("bf16", "fp32"), "int8": ("int8", "bf16", "fp32")}


def prefill_peak(peak: dict[str, float], dtype_class: str) -> float | None:
    """The fastest probed GEMM rate (T(FL)OP/s) a prefill of ``dtype_class`` can run on."""
    rates = [peak[c] for c in _PREFILL_GEMMS.get(dtype_class, (dtype_class,)) if peak.get(c)]
    return max(rates) if rates else None


def _round_bandwidth(ctx: CompareContext, rep: int) -> float:
    """The start's probe again (about a second) before each decode round: on a shared host the
    bandwidth drifts by 20% within minutes, so a decode cell is judged against the median of
    its own rounds' bandwidth."""
    gb_s = hardware.memory_bandwidth(ctx.threads, ctx.inputs.cache_dir)["gb_s"]
    ctx.log(f"decode round {rep}: read bandwidth {gb_s:.1f} GB/s")
    return gb_s
