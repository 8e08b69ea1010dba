"""The HTTP workloads of `anycore bench compare`: serve (streaming load at each ``--concurrency``)
and prefix (cold vs shared-prefix TTFT), on anycore's server(s) and ``llama-server``.

All servers start first and stay up for the phase; they take turns (A B C A B C ...), and each
cell's load record adds the CPU the idle servers used meanwhile (they must stay idle).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from anycore.bench import serve_workloads as sw
from anycore.bench.compare.context import CompareContext
from anycore.bench.load import LoadMonitor
from anycore.bench.peers import llama_server_build, servers
from anycore.bench.peers.base import PeerUnavailable
from anycore.bench.peers.gguf_files import gguf_variant
from anycore.bench.stats import interleave

PREFIX_CELLS = (("cold_ttft_s", "prefix cold TTFT"), ("shared_ttft_p50_s", "prefix shared c=4 TTFT p50"),
                ("alone_ttft_s", "prefix cached alone TTFT"))


def start_servers(ctx: CompareContext, gguf: Path) -> list[servers.Server]:
    """The run's servers that started; the others are recorded as skipped."""
    logs = ctx.inputs.out.parent / "logs"
    wanted = []
    if not ctx.args.no_anycore_server:
        wanted.append(servers.anycore_server("anycore-server bf16", str(gguf), ctx.threads, "none", logs))
        if ctx.config.quantization:
            q = ctx.config.quantization
            wanted.append(servers.anycore_server(f"anycore-server {q}", str(gguf), ctx.threads, q, logs))
    if "llama-server" in ctx.inputs.peers:
        try:
            exe = llama_server_build.ensure_llama_server(ctx.inputs.cache_dir, build=not ctx.args.no_build,
                                                         log=ctx.log, extra_args=ctx.args.llama_cmake_args)
            ver = llama_server_build.llama_server_version(exe)
            for qt in ctx.inputs.server_gguf_types:
                s = servers.llama_server(f"llama-server {qt}", exe,
                                         gguf_variant(gguf, qt, ctx.inputs.cache_dir / "gguf"), ctx.threads, logs)
                ctx.results.engines[s.name] = {"version": ver, "cmd": " ".join(s.cmd[1:])}
                wanted.append(s)
        except PeerUnavailable as e:
            ctx.results.skip("llama-server", str(e))
    started = []
    for s in wanted:
        ctx.log(f"starting {s.name}")
        try:
            s.start()
            started.append(s)
            ctx.results.engines.setdefault(s.name, {})["cmd"] = " ".join(s.cmd)
        except PeerUnavailable as e:
            ctx.results.skip(s.name, str(e))
    return started


def timed(others: list[servers.Server], fn: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """``fn()`` under the load monitor, plus the cores the idle servers used meanwhile."""
    idle0 = sum(o.cpu_seconds() for o in others)
    with LoadMonitor() as mon:
        value = fn()
    load = mon.report.as_dict()
    load["idle_servers_cores"] = round((sum(o.cpu_seconds() for o in others) - idle0) / max(mon.report.wall_s, 1e-9), 3)
    return value, load


def run_serving(ctx: CompareContext, gguf: Path) -> None:
    """serve and prefix (those of the run); the JSON is rewritten after each level."""
    started = start_servers(ctx, gguf)
    try:
        if "serve" in ctx.inputs.workloads:
            for c in ctx.inputs.concurrency:
                serve_level(ctx, started, c)
                ctx.results.checkpoint()
        if "prefix" in ctx.inputs.workloads:
            shared_prefix(ctx, started)
            ctx.results.checkpoint()
    finally:
        for s in started:
            s.stop()


def _rounds(ctx: CompareContext, started: list[servers.Server], what: str,
            measure: Callable[[servers.Server, int], dict[str, Any]]) -> dict[str, list[tuple[dict, dict]]]:
    """(result, load) per server over the interleaved repeats; a failed repeat is a skip."""
    res: dict[str, list[tuple[dict, dict]]] = {s.name: [] for s in started}
    for rep, s in interleave(started, ctx.args.repeats):
        time.sleep(ctx.args.settle)
        others = [o for o in started if o is not s]
        try:
            r, load = timed(others, lambda s=s, rep=rep: measure(s, rep))
        except Exception as e:  # noqa: BLE001 - a failing server is reported, the others still run
            ctx.results.skip(f"{s.name} {what}", f"{type(e).__name__}: {e}")
            continue
        res[s.name].append((r, load))
        ctx.log(f"{what} [{rep}] {s.name}: " + _summary(r, load))
    return res


def _summary(r: dict[str, Any], load: dict[str, float]) -> str:
    if "output_throughput" in r:
        return (f"{r['output_throughput']:.1f} tok/s, TTFT p50 {r['ttft_ms']['p50']:.0f} ms "
                f"(others {load['other_cores']:.2f} cores)")
    return f"cold {r['cold_ttft_s']:.2f}s, shared p50 {r['shared_ttft_p50_s']:.2f}s, alone {r['alone_ttft_s']:.2f}s"


def serve_level(ctx: CompareContext, started: list[servers.Server], c: int) -> None:
    a = ctx.args
    n = max(4, a.prompts_per_slot * c)
    res = _rounds(ctx, started, f"serve c={c}", lambda s, rep: sw.load_level(
        s.url, c, n, a.serve_input_len, a.serve_output_len, seed=1000 * rep + c))
    for s in started:
        runs = res[s.name]
        if not runs:
            continue
        loads = [ld for _, ld in runs]
        ctx.results.add(f"serve c={c} output", s.name, "tok/s", True,
                        [r["output_throughput"] for r, _ in runs], loads, requests=n)
        ctx.results.add(f"serve c={c} TTFT p50", s.name, "ms", False, [r["ttft_ms"]["p50"] for r, _ in runs], loads)
        ctx.results.add(f"serve c={c} ITL p50", s.name, "ms", False, [r["itl_ms"]["p50"] for r, _ in runs], loads)


def shared_prefix(ctx: CompareContext, started: list[servers.Server]) -> None:
    res = _rounds(ctx, started, "prefix", lambda s, rep: sw.shared_prefix(
        s.url, seed=500 + rep, prefix_len=ctx.args.prefix_len))
    for s in started:
        runs = res[s.name]
        if runs:
            loads = [ld for _, ld in runs]
            for key, title in PREFIX_CELLS:
                extra = {}
                if key == "shared_ttft_p50_s":  # each repeat's TTFTs in send order, and its priming request's
                    extra = {"ttft_s": [r["shared_ttft_s"] for r, _ in runs],
                             "prime_ttft_s": [r["prime_ttft_s"] for r, _ in runs]}
                ctx.results.add(title, s.name, "s", False, [r[key] for r, _ in runs], loads, **extra)
