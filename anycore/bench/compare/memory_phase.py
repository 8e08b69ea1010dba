"""The memory workload of `anycore bench compare`: resident memory per engine, each in a fresh
child process (``children/memory_child.py``): anycore's engines and llama.cpp's ``--gguf-types``
on the run's model, then anycore's engines again on each of ``--memory-models``.

The child reads its own ``/proc/self/status`` at three points: after importing the engine's
package (the runtime's own share: torch, libraries), after loading the model (weights, KV pool,
quantization done), and after a short generation (a 16-token prompt, ``gen_tokens`` greedy
tokens: first-use allocations, KV pages written). ``VmRSS`` counts anonymous and file-backed
resident pages alike (llama.cpp maps its GGUF file; anycore copies weights into anonymous
memory), so engines compare on the same footing; ``VmHWM`` is the peak, which includes
transients such as the float weights held while an online quantization runs.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from anycore.bench.children import run_child
from anycore.bench.children.memory_child import RESULT_MARKER
from anycore.bench.compare.context import CompareContext
from anycore.bench.load import LoadMonitor
from anycore.bench.peers.base import PeerUnavailable
from anycore.bench.peers.gguf_files import gguf_variant
from anycore.config import EngineConfig

MB = 1 << 20


def run_memory(ctx: CompareContext, gguf: Path) -> None:
    """Every model of the memory workload; the JSON is rewritten after each."""
    measure_model(ctx, gguf, "", with_peers=True)
    ctx.results.checkpoint()
    for path in ctx.inputs.memory_models:
        measure_model(ctx, path, f" [{path.name}]", with_peers=False)
        ctx.results.checkpoint()


def probes(ctx: CompareContext, model: Path, tagged: bool, with_peers: bool) -> list[tuple[str, Callable[[], dict]]]:
    """(engine name, measurement) per engine on ``model``."""
    n = ctx.args.memory_gen_tokens
    engines = ctx.anycore_engines(offline=False)
    if tagged:
        engines = [(name, replace(config, model=str(model))) for name, config in engines]
    out: list[tuple[str, Callable[[], dict]]] = [
        (name, lambda config=config: anycore_rss(config, n)) for name, config in engines]
    if with_peers and "llama-cpp" in ctx.inputs.peers:
        for qt in ctx.inputs.gguf_types:
            out.append((f"llama.cpp {qt}", lambda qt=qt: llama_cpp_rss(
                gguf_variant(model, qt, ctx.inputs.cache_dir / "gguf"), ctx.threads, n)))
    return out


def measure_model(ctx: CompareContext, model: Path, tag: str, with_peers: bool) -> None:
    n = ctx.args.memory_gen_tokens
    for name, probe in probes(ctx, model, bool(tag), with_peers):
        ctx.log(f"memory: {name}{tag} in a fresh process")
        with LoadMonitor() as mon:
            try:
                r = probe()
            except PeerUnavailable as e:
                ctx.results.skip(f"{name} memory{tag}", str(e))
                continue
            except Exception as e:  # noqa: BLE001 - a broken peer is reported, the others still run
                ctx.results.skip(f"{name} memory{tag}", f"{type(e).__name__}: {e}")
                continue
        load = mon.report.as_dict()
        ctx.log(f"memory: {name}{tag}: RSS {r['import']['VmRSS'] / MB:.0f} MB after import, "
                f"{r['load']['VmRSS'] / MB:.0f} after load, {r['generate']['VmRSS'] / MB:.0f} after {n} tokens "
                f"(peak {r['generate']['VmHWM'] / MB:.0f})")
        add_rows(ctx, name, tag, n, r, load)


def add_rows(ctx: CompareContext, name: str, tag: str, n: int, r: dict[str, Any], load: dict[str, float]) -> None:
    # resident memory does not depend on other processes' CPU use: no noise flag from it
    # (the load is kept in the JSON as cpu_load_while_probing)
    for point, title in (("load", "RSS after load"), ("generate", f"RSS after load + {n} tok")):
        ctx.results.add(title + tag, name, "MB", False, [r[point]["VmRSS"] / MB], [], cpu_load_while_probing=load,
                        import_mb=r["import"]["VmRSS"] / MB, peak_mb=r[point]["VmHWM"] / MB,
                        anon_mb=r[point].get("RssAnon", 0) / MB, file_mb=r[point].get("RssFile", 0) / MB,
                        weight_bytes=r.get("weight_bytes"))


# ---- the child processes ---------------------------------------------------------------------
def parse_report(stdout: str) -> dict[str, Any] | None:
    """The child's report, or None when it printed none (it failed before the end)."""
    for line in stdout.splitlines():
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER):])
    return None


def _measure(payload: dict[str, Any], timeout: float) -> dict[str, Any]:
    try:
        r = run_child("memory_child", payload, timeout)
    except subprocess.TimeoutExpired:
        raise PeerUnavailable(f"memory probe timed out after {timeout:.0f}s") from None
    report = parse_report(r.stdout)
    if report is None:
        raise PeerUnavailable(f"memory probe failed (rc {r.returncode}): {r.stderr.strip()[-300:]}")
    return report


def anycore_rss(config: EngineConfig, gen_tokens: int = 32, timeout: float = 900.0) -> dict[str, Any]:
    """RSS of an anycore ``Engine(config)`` in a fresh process (see the module docstring)."""
    return _measure({"engine": "anycore", "config": dataclasses.asdict(config), "gen_tokens": gen_tokens}, timeout)


def llama_cpp_rss(gguf: Path, threads: int, gen_tokens: int = 32, timeout: float = 600.0) -> dict[str, Any]:
    """RSS of llama-cpp-python on ``gguf`` in a fresh process (same points and settings as the
    offline llama.cpp runner: n_ctx 2048, batch 512)."""
    return _measure({"engine": "llama-cpp", "gguf": str(gguf), "threads": threads, "gen_tokens": gen_tokens}, timeout)
