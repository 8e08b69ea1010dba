"""`anycore bench compare`: anycore against llama.cpp and transformers on the same model and prompts.

Workloads (``--workloads``): decode (batch-1, tok/s after a 16-token prompt), prefill (one 512-token
prompt), batch (offline, ``--batch-prompts`` prompts at once), memory (RSS after load and after a
short generation, each engine in a fresh process: anycore bf16, anycore ``--quantization``,
llama.cpp's ``--gguf-types``), serve (streaming HTTP at each
``--concurrency``: output tok/s, TTFT p50, ITL p50), prefix (cold ~1000-token TTFT vs 16 requests
sharing a ~1000-token prefix at concurrency 4). Engines run interleaved (A B C A B C ...) for
``--repeats`` rounds; each cell reports the median, the spread (CV), other processes' CPU use while
it ran, its fraction of the physical limit, anycore/peer ratios and a NOISY flag. A peer that is not
installed or fails to start is reported as skipped.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from anycore.bench import hardware, report
from anycore.bench.load import LoadMonitor, top_other_processes
from anycore.bench.peers_offline import (
    AnycoreRunner,
    LlamaCppRunner,
    PeerUnavailable,
    TransformersRunner,
    gguf_stats,
    gguf_variant,
)
from anycore.bench.stats import interleave
from anycore.config import EngineConfig

WORKLOADS = ("decode", "prefill", "batch", "memory", "serve", "prefix")
PEERS = ("llama-cpp", "llama-server", "transformers")


def add_compare_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("compare")
    g.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma list of {', '.join(WORKLOADS)}")
    g.add_argument("--peers", default=",".join(PEERS), help=f"comma list of {', '.join(PEERS)} (or 'none')")
    g.add_argument("--gguf-types", default="Q4_1,Q8_0,F16", help="llama.cpp offline: GGUF types to run")
    g.add_argument("--server-gguf-types", default="Q8_0", help="llama-server: GGUF types to serve")
    g.add_argument("--hf-dtypes", default="bf16,fp32", help="transformers dtypes")
    g.add_argument("--no-anycore-server", action="store_true", help="skip anycore's own server in serve/prefix")
    g.add_argument("--kernels-off", action="store_true",
                   help="offline: also run anycore bf16 on the torch-native ops (kernels on vs off)")
    g.add_argument("--repeats", type=int, default=3)
    g.add_argument("--decode-tokens", type=int, default=128)
    g.add_argument("--prefill-tokens", type=int, default=512)
    g.add_argument("--batch-prompts", type=int, default=16)
    g.add_argument("--batch-input-len", type=int, default=128)
    g.add_argument("--batch-output-len", type=int, default=128)
    g.add_argument("--concurrency", default="1,4,16", help="serving concurrency levels")
    g.add_argument("--serve-input-len", type=int, default=100)
    g.add_argument("--serve-output-len", type=int, default=128)
    g.add_argument("--memory-gen-tokens", type=int, default=32, help="memory: tokens generated before the 2nd RSS")
    g.add_argument("--memory-models", default="",
                   help="memory: comma list of further checkpoints (HF folders or GGUF files) whose RSS is measured "
                        "too, anycore engines only, rows tagged with the file name: on a small model the runtime's "
                        "own ~220 MB hides what quantization saves")
    g.add_argument("--prefix-len", type=int, default=992, help="shared-prefix workload: prefix tokens (suffixes: 20)")
    g.add_argument("--prompts-per-slot", type=int, default=4, help="serving requests per level = this x concurrency (min 4)")
    g.add_argument("--quick", action="store_true",
                   help="1 repeat, 32 decode tokens, batch 4x(64 in, 32 out), concurrency 1,4, 2 prompts per slot")
    g.add_argument("--out", default="bench-compare/result.json", help="JSON path; charts are written next to it")
    g.add_argument("--cache-dir", default=str(Path.home() / ".cache/anycore/peers"),
                   help="GGUF copies, the llama-server build, the bandwidth probe")
    g.add_argument("--no-build", action="store_true", help="never build llama-server; skip it when not cached")
    g.add_argument("--llama-cmake-args", default="",
                   help="extra CMake args for the llama-server build, e.g. '-DGGML_NATIVE=OFF -DGGML_AVX512=ON' "
                        "where the native build uses instructions the machine traps (a VM advertising AMX)")
    g.add_argument("--settle", type=float, default=0.3, help="seconds of idle between measurements")
    g.add_argument("--noise-cores", type=float, default=0.15, help="flag a cell when others used more cores")
    g.add_argument("--noise-cv", type=float, default=0.10, help="flag a cell whose repeats spread more")
    g.add_argument("--retry-noisy", type=int, default=0,
                   help="offline: measure a repeat again (up to N more times) when other processes used more than "
                        "--noise-cores while it ran; the discarded attempts are counted in the JSON")
    g.add_argument("--quiet-wait", type=float, default=0.0,
                   help="offline: before each attempt, wait up to this many seconds for a second in which other "
                        "processes use less than --noise-cores (shared machines)")


def apply_quick(args: argparse.Namespace) -> None:
    if args.quick:
        args.repeats, args.decode_tokens = 1, min(args.decode_tokens, 32)
        args.batch_prompts, args.batch_input_len, args.batch_output_len = 4, 64, 32
        args.concurrency, args.prompts_per_slot = "1,4", 2


def _csv(value: str) -> list[str]:
    return [] if value.strip().lower() == "none" else [v.strip() for v in value.split(",") if v.strip()]


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("anycore", "torch", "transformers", "llama-cpp-python", "numpy", "matplotlib"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


class Compare:
    def __init__(self, args: argparse.Namespace, config: Any) -> None:
        apply_quick(args)
        self.args, self.config = args, config
        self.threads = config.threads or os.cpu_count() or 1
        self.config = replace(config, threads=self.threads)
        self.cache = Path(args.cache_dir).expanduser()
        self.out = Path(args.out)
        self.workloads, self.peers = _csv(args.workloads), _csv(args.peers)
        for w in self.workloads:
            if w not in WORKLOADS:
                raise SystemExit(f"unknown workload {w!r}; choose from {WORKLOADS}")
        self.measurements: list[dict[str, Any]] = []
        self.skipped: dict[str, str] = {}
        self.engines: dict[str, dict[str, Any]] = {}
        self.model = Path(config.model) if config.model else None

    def log(self, msg: str) -> None:
        print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def add(self, workload: str, engine: str, unit: str, higher: bool, values: list[float],
            loads: list[dict[str, float]], limit: float | None = None, **extra: Any) -> None:
        self.measurements.append(report.measurement(
            workload, engine, unit, higher, values, loads, limit, self.args.noise_cores, self.args.noise_cv, **extra))

    # ---- offline -------------------------------------------------------------------------
    def anycore_engines(self, offline: bool) -> list[tuple[str, EngineConfig]]:
        """anycore's engines in this run: bf16; on the torch-native ops (``--kernels-off``,
        offline workloads only); ``--quantization``; and with ``--quantize-lm-head`` the
        quantized engine a second time with its logits head in int8 too (and its embedding table,
        with ``--quantize-embedding``)."""
        c = replace(self.config, dtype="bfloat16", quantize_lm_head=False, quantize_embedding=False)
        engines = [("anycore bf16", replace(c, quantization=None))]
        if self.args.kernels_off and offline:  # the same engine on the portable ops: what the kernels buy
            engines.append(("anycore bf16 torch-native", replace(c, quantization=None, kernels="torch-native")))
        if c.quantization:
            engines.append((f"anycore {c.quantization}", c))
            if self.config.quantize_lm_head:
                embed = self.config.quantize_embedding
                engines.append((f"anycore {c.quantization} +int8 head" + (" +embed" if embed else ""),
                                replace(c, quantize_lm_head=True, quantize_embedding=embed)))
        return engines

    def _runners(self, gguf: Path) -> list[Any]:
        runners: list[Any] = []

        def attempt(name: str, make: Any) -> None:
            self.log(f"loading {name}")
            try:
                runners.append(make())
                self.engines[name] = {"weight_bytes": runners[-1].weight_bytes, **runners[-1].info}
            except PeerUnavailable as e:
                self.skipped[name] = str(e)
            except Exception as e:  # noqa: BLE001 - a broken peer is reported, the others still run
                self.skipped[name] = f"failed to load: {type(e).__name__}: {e}"

        for name, config in self.anycore_engines(offline=True):
            attempt(name, lambda name=name, config=config: AnycoreRunner(name, config))
        if "llama-cpp" in self.peers:
            for qt in _csv(self.args.gguf_types):
                attempt(f"llama.cpp {qt}", lambda qt=qt: LlamaCppRunner(
                    f"llama.cpp {qt}", gguf_variant(gguf, qt, self.cache / "gguf"), self.threads))
        if "transformers" in self.peers:
            for dt in _csv(self.args.hf_dtypes):
                attempt(f"transformers {dt}", lambda dt=dt: TransformersRunner(
                    f"transformers {dt}", gguf, dt, self.threads))
        return runners

    def offline(self, gguf: Path, limits: dict[str, Any]) -> None:
        a = self.args
        runners = self._runners(gguf)
        jobs = {
            "decode": (f"decode b=1 ({a.decode_tokens} tok)", lambda r, rng: r.decode(a.decode_tokens, rng)),
            "prefill": (f"prefill {a.prefill_tokens}", lambda r, rng: r.prefill(a.prefill_tokens, rng)),
            "batch": (f"batch {a.batch_prompts}x({a.batch_input_len}+{a.batch_output_len})",
                      lambda r, rng: r.batch(a.batch_prompts, a.batch_input_len, a.batch_output_len, rng)),
        }
        for wl in (w for w in ("decode", "prefill", "batch") if w in self.workloads):
            title, fn = jobs[wl]
            vals: dict[str, list[float]] = {r.name: [] for r in runners}
            loads: dict[str, list[dict[str, float]]] = {r.name: [] for r in runners}
            discarded: dict[str, int] = {r.name: 0 for r in runners}
            round_bw: list[float] = []  # decode: the read bandwidth again before each round
            for rep, runner in interleave(runners, a.repeats):
                if wl == "decode" and limits.get("bandwidth_gb_s") and runner is runners[0]:
                    round_bw.append(self._round_bandwidth(rep))
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
                        self.log(f"{title} [{rep}] {runner.name}: {v:.1f} tok/s discarded (others {others:.2f} cores)")
                        continue
                    break
                if v is None:
                    continue
                vals[runner.name].append(v)
                loads[runner.name].append(mon.report.as_dict())
                self.log(f"{title} [{rep}] {runner.name}: {v:.1f} tok/s (others {mon.report.other_cores:.2f} cores)")
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
                elif wl == "prefill" and limits.get("peak", {}).get(r.dtype_class):
                    limit = limits["peak"][r.dtype_class] * 1e12 / limits["prefill_flops_per_token"]
                self.add(title, r.name, "tok/s", True, vals[r.name], loads[r.name], limit,
                         dtype_class=r.dtype_class, weight_bytes=r.weight_bytes, discarded_noisy=discarded[r.name],
                         **extra)
        for r in runners:
            r.close()

    def _round_bandwidth(self, rep: int) -> float:
        """The start's probe again (about a second) before each decode round: on a shared host the
        bandwidth drifts by 20% within minutes, so a decode cell is judged against the median of
        its own rounds' bandwidth."""
        gb_s = hardware.memory_bandwidth(self.threads, self.cache)["gb_s"]
        self.log(f"decode round {rep}: read bandwidth {gb_s:.1f} GB/s")
        return gb_s

    # ---- memory --------------------------------------------------------------------------
    def memory(self, gguf: Path) -> None:
        """RSS per engine, each in a fresh child process (anycore.bench.memory); then anycore's
        engines again on each of ``--memory-models``."""
        self._memory_of(gguf, "", with_peers=True)
        for extra in _csv(self.args.memory_models):
            path = Path(extra)
            self._memory_of(path, f" [{path.name}]", with_peers=False)

    def _memory_of(self, model: Path, tag: str, with_peers: bool) -> None:
        from anycore.bench import memory

        n = self.args.memory_gen_tokens
        engines = self.anycore_engines(offline=False)
        if tag:
            engines = [(name, replace(config, model=str(model))) for name, config in engines]
        probes: list[tuple[str, Any]] = [(name, lambda config=config: memory.anycore_rss(config, n))
                                         for name, config in engines]
        if with_peers and "llama-cpp" in self.peers:
            for qt in _csv(self.args.gguf_types):
                probes.append((f"llama.cpp {qt}", lambda qt=qt: memory.llama_cpp_rss(
                    gguf_variant(model, qt, self.cache / "gguf"), self.threads, n)))
        for name, probe in probes:
            self.log(f"memory: {name}{tag} in a fresh process")
            with LoadMonitor() as mon:
                try:
                    r = probe()
                except PeerUnavailable as e:
                    self.skipped[f"{name} memory{tag}"] = str(e)
                    continue
                except Exception as e:  # noqa: BLE001 - a broken peer is reported, the others still run
                    self.skipped[f"{name} memory{tag}"] = f"{type(e).__name__}: {e}"
                    continue
            load = mon.report.as_dict()
            mb = 1 << 20
            self.log(f"memory: {name}{tag}: RSS {r['import']['VmRSS'] / mb:.0f} MB after import, "
                     f"{r['load']['VmRSS'] / mb:.0f} after load, {r['generate']['VmRSS'] / mb:.0f} after {n} tokens "
                     f"(peak {r['generate']['VmHWM'] / mb:.0f})")
            # resident memory does not depend on other processes' CPU use: no noise flag from it
            # (the load is kept in the JSON as cpu_load_while_probing)
            for point, title in (("load", "RSS after load"), ("generate", f"RSS after load + {n} tok")):
                self.add(title + tag, name, "MB", False, [r[point]["VmRSS"] / mb], [], cpu_load_while_probing=load,
                         import_mb=r["import"]["VmRSS"] / mb, peak_mb=r[point]["VmHWM"] / mb,
                         anon_mb=r[point].get("RssAnon", 0) / mb, file_mb=r[point].get("RssFile", 0) / mb,
                         weight_bytes=r.get("weight_bytes"))

    # ---- serving -------------------------------------------------------------------------
    def _servers(self, gguf: Path) -> list[Any]:
        from anycore.bench import peers_server as ps

        logs = self.out.parent / "logs"
        servers = []
        if not self.args.no_anycore_server:
            servers.append(ps.anycore_server("anycore-server bf16", str(gguf), self.threads, None, logs))
            if self.config.quantization:
                q = self.config.quantization
                servers.append(ps.anycore_server(f"anycore-server {q}", str(gguf), self.threads, q, logs))
        if "llama-server" in self.peers:
            try:
                exe = ps.ensure_llama_server(self.cache, build=not self.args.no_build, log=self.log,
                                             extra_args=self.args.llama_cmake_args)
                ver = ps.llama_server_version(exe)
                for qt in _csv(self.args.server_gguf_types):
                    s = ps.llama_server(f"llama-server {qt}", exe, gguf_variant(gguf, qt, self.cache / "gguf"),
                                        self.threads, logs)
                    self.engines[s.name] = {"version": ver, "cmd": " ".join(s.cmd[1:])}
                    servers.append(s)
            except PeerUnavailable as e:
                self.skipped["llama-server"] = str(e)
        started = []
        for s in servers:
            self.log(f"starting {s.name}")
            try:
                s.start()
                started.append(s)
                self.engines.setdefault(s.name, {})["cmd"] = " ".join(s.cmd)
            except PeerUnavailable as e:
                self.skipped[s.name] = str(e)
        return started

    def _timed(self, server: Any, others: list[Any], fn: Any) -> tuple[Any, dict[str, float]]:
        idle0 = sum(o.cpu_seconds() for o in others)
        with LoadMonitor() as mon:
            value = fn()
        load = mon.report.as_dict()
        load["idle_servers_cores"] = round((sum(o.cpu_seconds() for o in others) - idle0) / max(mon.report.wall_s, 1e-9), 3)
        return value, load

    def serve(self, gguf: Path) -> None:
        from anycore.bench import serve_workloads as sw

        a = self.args
        servers = self._servers(gguf)
        try:
            if "serve" in self.workloads:
                for c in (int(x) for x in _csv(a.concurrency)):
                    n = max(4, a.prompts_per_slot * c)
                    res: dict[str, list[tuple[dict, dict]]] = {s.name: [] for s in servers}
                    for rep, s in interleave(servers, a.repeats):
                        time.sleep(a.settle)
                        others = [o for o in servers if o is not s]
                        try:
                            summ, load = self._timed(s, others, lambda s=s, rep=rep, c=c, n=n: sw.load_level(
                                s.url, c, n, a.serve_input_len, a.serve_output_len, seed=1000 * rep + c))
                        except Exception as e:  # noqa: BLE001
                            self.skipped[f"{s.name} serve c={c}"] = f"{type(e).__name__}: {e}"
                            continue
                        res[s.name].append((summ, load))
                        self.log(f"serve c={c} [{rep}] {s.name}: {summ['output_throughput']:.1f} tok/s, TTFT p50 "
                                 f"{summ['ttft_ms']['p50']:.0f} ms (others {load['other_cores']:.2f} cores)")
                    for s in servers:
                        runs = res[s.name]
                        if not runs:
                            continue
                        loads = [ld for _, ld in runs]
                        self.add(f"serve c={c} output", s.name, "tok/s", True,
                                 [r["output_throughput"] for r, _ in runs], loads, requests=n)
                        self.add(f"serve c={c} TTFT p50", s.name, "ms", False, [r["ttft_ms"]["p50"] for r, _ in runs], loads)
                        self.add(f"serve c={c} ITL p50", s.name, "ms", False, [r["itl_ms"]["p50"] for r, _ in runs], loads)
            if "prefix" in self.workloads:
                res2: dict[str, list[tuple[dict, dict]]] = {s.name: [] for s in servers}
                for rep, s in interleave(servers, a.repeats):
                    time.sleep(a.settle)
                    others = [o for o in servers if o is not s]
                    try:
                        r, load = self._timed(s, others, lambda s=s, rep=rep: sw.shared_prefix(
                            s.url, seed=500 + rep, prefix_len=a.prefix_len))
                    except Exception as e:  # noqa: BLE001
                        self.skipped[f"{s.name} prefix"] = f"{type(e).__name__}: {e}"
                        continue
                    res2[s.name].append((r, load))
                    self.log(f"prefix [{rep}] {s.name}: cold {r['cold_ttft_s']:.2f}s, shared p50 "
                             f"{r['shared_ttft_p50_s']:.2f}s, alone {r['alone_ttft_s']:.2f}s")
                for s in servers:
                    runs = res2[s.name]
                    if runs:
                        loads = [ld for _, ld in runs]
                        for key, title in (("cold_ttft_s", "prefix cold TTFT"),
                                           ("shared_ttft_p50_s", "prefix shared c=4 TTFT p50"),
                                           ("alone_ttft_s", "prefix cached alone TTFT")):
                            self.add(title, s.name, "s", False, [r[key] for r, _ in runs], loads)
        finally:
            for s in servers:
                s.stop()

    # ---- whole run -----------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        import torch

        from anycore.loader.default_model import default_model_path

        gguf = self.model or default_model_path()
        if gguf.suffix != ".gguf":
            raise SystemExit("bench compare needs a GGUF model (llama.cpp peers read the same file)")
        torch.set_num_threads(self.threads)
        self.busiest = busiest = top_other_processes()
        self.log(f"model {gguf}, {self.threads} threads; busiest other processes now (cores): {busiest}")
        for _ in range(1 + max(0, self.args.retry_noisy)):  # the limits are as load-sensitive as the cells
            wait_for_quiet(self.args.noise_cores, self.args.quiet_wait)
            with LoadMonitor() as mon:
                bw = hardware.memory_bandwidth(self.threads, self.cache)
                peak = hardware.peak_gemm(self.threads)
            if mon.report.other_cores <= self.args.noise_cores:
                break
            self.log(f"limits measured while others used {mon.report.other_cores:.2f} cores; measuring again")
        self.log(f"read bandwidth {bw['gb_s']:.1f} GB/s; peak GEMM {peak} (others {mon.report.other_cores:.2f} cores)")
        st = gguf_stats(gguf)
        mc = _model_shape(gguf)
        t = self.args.prefill_tokens
        # model FLOPs per prefilled token: block matmuls + causal attention (QK^T and PV) + one logits row
        attn = 2 * 2 * mc["layers"] * mc["q_dim"] * (t + 1) / 2
        flops_tok = 2 * st["block_matmul_params"] + attn + 2 * mc["vocab"] * mc["hidden"] / t
        limits = {"bandwidth_gb_s": bw["gb_s"], "peak": peak, "prefill_flops_per_token": flops_tok}
        t0 = time.time()
        if any(w in self.workloads for w in ("decode", "prefill", "batch")):
            self.offline(gguf, limits)
            self.checkpoint(self.result(gguf, t0, bw, peak, mon, flops_tok), partial=True)
        if "memory" in self.workloads:
            self.memory(gguf)
            self.checkpoint(self.result(gguf, t0, bw, peak, mon, flops_tok), partial=True)
        if any(w in self.workloads for w in ("serve", "prefix")):
            self.serve(gguf)
        return self.result(gguf, t0, bw, peak, mon, flops_tok)

    def checkpoint(self, result: dict[str, Any], partial: bool) -> None:
        """Writes what is measured so far, so an interrupted long run still leaves its numbers."""
        report.write_json({**result, "partial": partial}, self.out)

    def result(self, gguf: Path, t0: float, bw: dict, peak: dict, mon: LoadMonitor, flops_tok: float) -> dict[str, Any]:
        report.add_ratios(self.measurements)
        return {
            "meta": {"started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t0)), "seconds": time.time() - t0,
                     "cpu_model": hardware.cpu_model(), "machine": platform.machine(), "cpus": os.cpu_count(),
                     "threads": self.threads, "model": str(gguf), "quantization": self.config.quantization,
                     "busiest_other_processes_at_start": self.busiest, "versions": versions(),
                     "repeats": self.args.repeats, "args": {k: v for k, v in vars(self.args).items() if k != "func"},
                     "noise_thresholds": {"other_cores": self.args.noise_cores, "cv": self.args.noise_cv}},
            "hardware": {"bandwidth": bw, "peak_gemm_tflops": peak, "load": mon.report.as_dict(),
                         "prefill_flops_per_token": flops_tok},
            "engines": self.engines, "skipped": self.skipped, "measurements": self.measurements,
            "targets": report.quantization_targets(self.measurements, self.config.quantization),
        }


def wait_for_quiet(max_other_cores: float, max_wait: float, window: float = 1.0) -> bool:
    """Waits (up to ``max_wait`` s) for a ``window`` in which other processes used at most
    ``max_other_cores``; True when one came (or no wait was asked for)."""
    if max_wait <= 0:
        return True
    end = time.monotonic() + max_wait
    while time.monotonic() < end:
        with LoadMonitor(interval=window) as mon:
            time.sleep(window)
        if mon.report.other_cores <= max_other_cores:
            return True
    return False


def _model_shape(gguf: Path) -> dict[str, int]:
    from gguf import GGUFReader

    r = GGUFReader(str(gguf))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()

    def field(key: str) -> int:
        f = r.fields[f"{arch}.{key}"]
        return int(f.parts[f.data[0]][0])

    vocab = next((int(t.shape[-1]) for t in r.tensors if t.name == "token_embd.weight"), 0)
    hidden = field("embedding_length")
    heads = field("attention.head_count")
    return {"layers": field("block_count"), "hidden": hidden, "q_dim": hidden // heads * heads, "vocab": vocab}


def run_compare(args: argparse.Namespace, config: Any) -> int:
    result = Compare(args, config).run()
    out = Path(args.out)
    report.write_json(result, out)
    print(report.format_table(result))
    print(f"\nJSON: {out}")
    try:
        from anycore.bench.charts import write_charts

        for p in write_charts(result, out.with_suffix("")):
            print(f"chart: {p}")
    except ImportError:
        print("charts skipped: matplotlib not installed (pip install -e .[bench])")
    return 0
