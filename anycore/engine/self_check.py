"""Decode self-check: a few real decode steps at start-up, reported as weight bytes per second
against the machine's probed read bandwidth.

A batch-1 decode step reads every streamed weight once (``Engine.weight_bytes``), so its speed
is a bandwidth figure. The same build on the same machine has been seen to decode at either
~117 or ~195 tok/s depending on the process; this check makes such a slow mode visible (in the
server's start-up log and in ``anycore doctor``) instead of silent. Small models can beat the
probed DRAM bandwidth (their weights partly stay in the last-level cache), so the check reports
the ratio and only calls a step slow below ``SLOW_FRACTION`` of the probe.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from anycore.sampling_params import SamplingParams

# below this fraction of the probed read bandwidth a decode step is reported as slow
SLOW_FRACTION = 0.5
REQUEST_ID = "anycore-self-check"


@dataclass(frozen=True)
class DecodeSelfCheck:
    ms_per_token: float  # median decode step of one request, prompt excluded
    weight_gb_s: float  # streamed weight bytes / that step (1e9 bytes/s)
    probed_gb_s: float | None  # the machine's read bandwidth now (None: no probe ran)
    probe_method: str
    threads: int
    tokens: int

    @property
    def fraction(self) -> float | None:
        return self.weight_gb_s / self.probed_gb_s if self.probed_gb_s else None

    @property
    def slow(self) -> bool:
        f = self.fraction
        return f is not None and f < SLOW_FRACTION

    def summary(self) -> str:
        text = (f"decode {self.ms_per_token:.2f} ms/token ({1e3 / self.ms_per_token:.0f} tok/s, batch 1, "
                f"{self.threads} threads) = {self.weight_gb_s:.1f} GB/s of weights")
        if self.probed_gb_s:
            text += f", {100 * self.fraction:.0f}% of the probed read bandwidth {self.probed_gb_s:.1f} GB/s"
        if self.slow:
            text += (f" -- SLOW: under {100 * SLOW_FRACTION:.0f}% of the probe (other processes on these cores, "
                     "or a slow placement of this process; try restarting it or `--threads`)")
        return text

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fraction": self.fraction, "slow": self.slow}


def probe_read_bandwidth(threads: int) -> tuple[float | None, str]:
    """(GB/s, method) of a short read-bandwidth probe with ``threads`` threads; (None, why) if
    it cannot run. The compiled probe is cached under ~/.cache/anycore/probe."""
    from anycore.bench.hardware import memory_bandwidth

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "anycore" / "probe"
    try:
        r = memory_bandwidth(threads, cache, mib=256, passes=4)
    except Exception as e:  # noqa: BLE001 - a probe that cannot run leaves the figure unset
        return None, f"probe failed: {e}"
    return float(r["gb_s"]), str(r["method"])


def decode_self_check(engine: Any, tokens: int = 24, probe: bool = True) -> DecodeSelfCheck:
    """Decodes ``tokens`` greedy tokens of a short scratch request through ``engine.step`` (the
    path a request alone takes) and times the steps after its prefill. Only on an idle engine:
    the steps of other requests would be counted too."""
    if engine.has_unfinished():
        raise RuntimeError("decode_self_check needs an idle engine")
    prompt = list(range(1, 9))  # eight ordinary ids: any vocabulary has them
    # (speculative=False: it times the plain decode a weight read bounds, not verify steps)
    engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=tokens + 1, ignore_eos=True,
                                              speculative=False), request_id=REQUEST_ID)
    times, made = [], 0
    try:
        engine.step()  # the prefill (and the first token)
        while engine.has_unfinished():
            t0 = time.perf_counter()
            outs = engine.step()
            dt = time.perf_counter() - t0
            n = sum(len(o.new_token_ids) for o in outs)
            if n:
                times += [dt / n] * n
                made += n
    finally:
        engine.abort(REQUEST_ID)
    step = statistics.median(times)
    threads = torch.get_num_threads()
    gb_s, method = probe_read_bandwidth(threads) if probe else (None, "not probed")
    return DecodeSelfCheck(ms_per_token=step * 1e3, weight_gb_s=engine.weight_bytes / step / 1e9,
                           probed_gb_s=gb_s, probe_method=method, threads=threads, tokens=made)
