"""Results of `anycore bench compare`: measurement records, ratios, the terminal table, the JSON file.

Everything here works on plain dicts (the JSON form) so a saved result can be re-rendered and the
formatting is testable with a fake result.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from anycore.bench.stats import NOISE_CV, NOISE_OTHER_CORES, cv, fmt_num, median, noise_check, ratio


def measurement(workload: str, engine: str, unit: str, higher_is_better: bool, values: list[float],
                loads: list[dict[str, float]], limit: float | None = None, max_other_cores: float = NOISE_OTHER_CORES,
                max_cv: float = NOISE_CV, **extra: Any) -> dict[str, Any]:
    """One (workload, engine) cell: repeats, their median and spread, load and the noise verdict.

    ``limit``: the physical ceiling in the same unit (e.g. bandwidth / weight bytes for decode);
    ``fraction_of_limit`` = median / limit.
    """
    med = median(values)
    others = [ld.get("other_cores", 0.0) for ld in loads]
    check = noise_check(values, others, max_other_cores, max_cv)
    return {
        "workload": workload, "engine": engine, "unit": unit, "higher_is_better": higher_is_better,
        "median": med, "values": values, "cv": cv(values), "loads": loads,
        "other_cores_max": max(others, default=0.0),
        "limit": limit, "fraction_of_limit": (med / limit) if limit else None,
        "noisy": check.noisy, "noise_reasons": list(check.reasons), **extra,
    }


def is_anycore(engine: str) -> bool:
    return engine.startswith("anycore")


def add_ratios(measurements: list[dict[str, Any]]) -> None:
    """Per workload, ``ratio`` = reference anycore median / this engine's median, where the
    reference is the workload's first anycore engine (``ratio_ref`` names it)."""
    refs: dict[str, dict[str, Any]] = {}
    for m in measurements:
        if is_anycore(m["engine"]) and m["workload"] not in refs:
            refs[m["workload"]] = m
    for m in measurements:
        ref = refs.get(m["workload"])
        m["ratio_ref"] = ref["engine"] if ref else None
        m["ratio"] = ratio(ref["median"], m["median"], m["higher_is_better"]) if ref and ref is not m else None


# issue #5's benchmark targets for a quantized anycore engine: (workload prefix, peer, wanted
# quantized/peer ratio, higher is better)
QUANT_TARGETS = (("decode", "llama.cpp Q8_0", 1.3), ("prefill", "llama.cpp Q8_0", 2.0))
# a GGUF file served in its own blocks is judged against llama.cpp on the same file (issue #19:
# batch-1 decode >= 1.3x); its type fills in the peer's name
GGUF_TARGETS = (("decode", "llama.cpp {file_type}", 1.3),)


def quantization_targets(measurements: list[dict[str, Any]], quantization: str | None,
                         file_type: str | None = None) -> list[dict[str, Any]]:
    """The quantized engine against its targets: decode and prefill vs llama.cpp Q8_0 (same
    run; for ``gguf``, decode vs llama.cpp on the same file, whose type is ``file_type``),
    resident memory vs anycore bf16 (wanted: about half), decode's fraction of the bandwidth
    limit. Cells not measured in this run are left out."""
    if not quantization:
        return []
    peer_targets = (tuple((w, peer.format(file_type=file_type), want) for w, peer, want in GGUF_TARGETS)
                    if quantization == "gguf" else QUANT_TARGETS)
    quant = f"anycore {quantization}"  # and its variants, e.g. "anycore w8a8_int8 +int8 head"
    cells = {(m["workload"], m["engine"]): m for m in measurements}
    out = []
    for m in measurements:
        if m["engine"] != quant and not m["engine"].startswith(quant + " "):
            continue
        wl = m["workload"]
        for prefix, peer, want in peer_targets:
            other = cells.get((wl, peer))
            if wl.startswith(prefix) and other:
                got = m["median"] / other["median"]
                out.append({"engine": m["engine"], "workload": wl, "versus": peer, "ratio": got,
                            "target": f">= {want}", "met": got >= want, "noisy": m["noisy"] or other["noisy"]})
        if wl.startswith("RSS"):
            base = cells.get((wl, "anycore bf16"))
            if base:
                got = m["median"] / base["median"]
                base_over = base["median"] - base.get("import_mb", 0.0)
                over = m["median"] - m.get("import_mb", 0.0)
                out.append({"engine": m["engine"], "workload": wl, "versus": "anycore bf16", "ratio": got,
                            "target": "~0.5", "met": got <= 0.6,
                            "ratio_above_import": over / base_over if base_over > 0 else None, "noisy": False})
        if wl.startswith("decode") and m.get("fraction_of_limit"):
            out.append({"engine": m["engine"], "workload": wl, "versus": "bandwidth limit",
                        "ratio": m["fraction_of_limit"], "target": "-", "met": None, "noisy": m["noisy"]})
    return out


def workloads_in_order(measurements: list[dict[str, Any]]) -> list[str]:
    seen: list[str] = []
    for m in measurements:
        if m["workload"] not in seen:
            seen.append(m["workload"])
    return seen


def format_table(result: dict[str, Any]) -> str:
    ms = result["measurements"]
    head = ("workload", "engine", "median", "unit", "cv", "n", "others", "of limit", "anycore/this", "flags")
    rows: list[tuple[str, ...]] = []
    for wl in workloads_in_order(ms):
        for m in (x for x in ms if x["workload"] == wl):
            r = m.get("ratio")
            rows.append((
                wl, m["engine"], fmt_num(m["median"]), m["unit"] + (" ↑" if m["higher_is_better"] else " ↓"), f"{m['cv']:.0%}", str(len(m["values"])),
                f"{m['other_cores_max']:.2f}",
                f"{m['fraction_of_limit']:.0%}" if m.get("fraction_of_limit") else "-",
                (f"{r:.2f}" if r is not None else ("ref" if m.get("ratio_ref") == m["engine"] else "-")),
                ("NOISY: " + "; ".join(m["noise_reasons"])) if m["noisy"] else "",
            ))
        rows.append(())
    # (a list: a run whose every engine was skipped has no rows)
    widths = [max([len(h), *(len(r[i]) for r in rows if r)]) for i, h in enumerate(head)]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if i < 2 or i in (3, 9) else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [line(head), "  ".join("-" * w for w in widths)]
    out += [line(r) if r else "" for r in rows]
    hw = result.get("hardware", {})
    meta = result.get("meta", {})
    out.append(f"cpu: {meta.get('cpu_model', '?')}, {meta.get('threads', '?')} threads; "
               f"read bandwidth {fmt_num(hw.get('bandwidth', {}).get('gb_s'))} GB/s; peak GEMM "
               + ", ".join(f"{k} {v:.2f}" for k, v in hw.get("peak_gemm_tflops", {}).items()) + " T(FL)OP/s")
    probe_load = hw.get("load", {}).get("other_cores", 0.0)
    limit_cores = meta.get("noise_thresholds", {}).get("other_cores", NOISE_OTHER_CORES)
    if probe_load > limit_cores:
        out.append(f"NOISY limits: other processes used {probe_load:.2f} cores while bandwidth and peak GEMM were "
                   "measured, so the limits are low and 'of limit' reads high (can exceed 100%)")
    decode_bw = next((c["bandwidth_gb_s"] for c in result.get("measurements", []) if c.get("bandwidth_rounds_gb_s")), None)
    if decode_bw is not None:
        out.append(f"decode limits use the read bandwidth probed before each decode round: median {decode_bw:.1f} GB/s")
    out.append("others = busiest repeat's mean CPU use by other processes (cores); of limit = decode vs "
               "bandwidth/weight bytes, prefill vs peak GEMM of its dtype; anycore/this = reference anycore "
               "median / this median (↑ higher is better: > 1 favours anycore; ↓ latency: < 1 favours anycore)")
    for t in result.get("targets", []):
        met = {True: "met", False: "NOT met", None: ""}[t["met"]]
        extra = (f" (above the import baseline: {t['ratio_above_import']:.2f})"
                 if t.get("ratio_above_import") is not None else "")
        who = t.get("engine") or result.get("meta", {}).get("quantization") or "quantized"
        out.append(f"target: {t['workload']}: {who} / "
                   f"{t['versus']} = {t['ratio']:.2f}{extra}, wanted {t['target']} {met}"
                   + (" (NOISY)" if t["noisy"] else ""))
    for name, reason in result.get("skipped", {}).items():
        out.append(f"skipped {name}: {reason}")
    noisy = sum(m["noisy"] for m in ms)
    if noisy:
        out.append(f"{noisy} of {len(ms)} measurements flagged NOISY: re-run on an idle machine before quoting them")
    return "\n".join(out)


def write_json_atomic(result: Any, path: Path) -> None:
    """Writes ``result`` as JSON through a temporary file renamed over ``path``: a crash while
    writing leaves the previous checkpoint whole, never a truncated file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
