"""What the phases of `anycore bench compare` share: the checked inputs, the thread count, the
list of anycore engines in this run, and the result as it grows (``ResultLog``): cells, skipped
engines, engine details, and the JSON file rewritten after every workload, so a late failure or
an interrupt keeps every cell measured before it (the file says ``"partial": true`` and, after a
failure, the ``error``).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from anycore.bench import hardware, report
from anycore.bench.compare.args import CompareInputs
from anycore.bench.peers.gguf_files import gguf_type
from anycore.config import EngineConfig


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("anycore", "torch", "transformers", "llama-cpp-python", "numpy", "matplotlib"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


class ResultLog:
    def __init__(self, out: Path, args: argparse.Namespace) -> None:
        self.out, self.args = out, args
        self.noise_cores, self.noise_cv = args.noise_cores, args.noise_cv  # a cell's NOISY thresholds
        self.measurements: list[dict[str, Any]] = []
        self.skipped: dict[str, str] = {}
        self.engines: dict[str, dict[str, Any]] = {}
        self.meta: dict[str, Any] = {}
        self.hardware: dict[str, Any] = {}
        self.quantization: str | None = None
        self.t0 = time.time()

    def start(self, model: Path, threads: int, quantization: str | None, busiest: list[tuple[str, float]],
              hardware_limits: dict[str, Any]) -> None:
        """Called once the limits are measured: the workloads' clock starts here."""
        self.t0 = time.time()
        self.quantization = quantization
        self.hardware = hardware_limits
        self.meta = {
            "cpu_model": hardware.cpu_model(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "threads": threads, "model": str(model), "model_type": gguf_type(model), "quantization": quantization,
            "busiest_other_processes_at_start": busiest, "versions": versions(), "repeats": self.args.repeats,
            "args": {k: v for k, v in vars(self.args).items() if k != "func"},
            "noise_thresholds": {"other_cores": self.noise_cores, "cv": self.noise_cv},
        }

    def add(self, workload: str, engine: str, unit: str, higher: bool, values: list[float],
            loads: list[dict[str, float]], limit: float | None = None, **extra: Any) -> None:
        self.measurements.append(report.measurement(
            workload, engine, unit, higher, values, loads, limit, self.noise_cores, self.noise_cv, **extra))

    def skip(self, name: str, reason: str) -> None:
        self.skipped[name] = reason

    def result(self, partial: bool, error: str | None = None) -> dict[str, Any]:
        report.add_ratios(self.measurements)
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.t0))
        out = {
            "meta": {"started": started, "seconds": time.time() - self.t0, **self.meta},
            "hardware": self.hardware, "engines": self.engines, "skipped": self.skipped,
            "measurements": self.measurements,
            "targets": report.quantization_targets(self.measurements, self.quantization,
                                                   self.meta.get("model_type")),
            "partial": partial,
        }
        if error is not None:
            out["error"] = error
        return out

    def checkpoint(self, error: str | None = None) -> None:
        """Writes what is measured so far (called after every workload and on a failure)."""
        report.write_json_atomic(self.result(partial=True, error=error), self.out)

    def finish(self) -> dict[str, Any]:
        result = self.result(partial=False)
        report.write_json_atomic(result, self.out)
        return result


@dataclass
class CompareContext:
    args: argparse.Namespace
    config: EngineConfig  # threads resolved: every engine and peer runs the same count
    inputs: CompareInputs
    results: ResultLog

    @property
    def threads(self) -> int:
        assert self.config.threads is not None
        return self.config.threads

    def log(self, msg: str) -> None:
        print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def anycore_engines(self, offline: bool) -> list[tuple[str, EngineConfig]]:
        """anycore's engines in this run: bf16; on the torch-native ops (``--kernels-off``,
        offline workloads only); ``--quantization``; and with ``--quantize-lm-head`` the
        quantized engine a second time with its logits head in int8 too (and its embedding table,
        with ``--quantize-embedding``)."""
        c = replace(self.config, dtype="bfloat16", quantize_lm_head=False, quantize_embedding=False)
        # bf16: dense weights, a GGUF file's dequantized ("none"; the default would serve its blocks)
        engines = [("anycore bf16", replace(c, quantization="none"))]
        if self.args.kernels_off and offline:  # the same engine on the portable ops: what the kernels buy
            engines.append(("anycore bf16 torch-native", replace(c, quantization="none", kernels="torch-native")))
        if c.quantization:
            engines.append((f"anycore {c.quantization}", c))
            if self.config.quantize_lm_head:
                embed = self.config.quantize_embedding
                engines.append((f"anycore {c.quantization} +int8 head" + (" +embed" if embed else ""),
                                replace(c, quantize_lm_head=True, quantize_embedding=embed)))
        return engines
