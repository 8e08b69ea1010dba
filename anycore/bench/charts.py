"""PNG charts for `anycore bench compare`: one bar chart per workload group, one colour per engine.

Bars are medians; the whisker spans the repeats' min..max; a hatched bar is a NOISY measurement;
a dotted line marks the physical limit where one applies (decode, prefill).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anycore.bench.report import workloads_in_order

# workload-name prefix -> chart file suffix; each chart holds the workloads of that group
GROUPS = (("decode", "decode"), ("prefill", "prefill"), ("batch", "batch"), ("RSS", "memory"),
          ("serve", "serving"), ("prefix", "prefix"))


def _group(workload: str) -> str:
    for prefix, suffix in GROUPS:
        if workload.startswith(prefix):
            return suffix
    return "other"


def engine_colours(engines: list[str]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {e: cmap(i % 10) for i, e in enumerate(engines)}


def write_charts(result: dict[str, Any], stem: Path) -> list[Path]:
    """Writes ``<stem>-<group>.png`` per workload group; returns the paths. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = result["measurements"]
    engines: list[str] = []
    for m in ms:
        if m["engine"] not in engines:
            engines.append(m["engine"])
    colours = engine_colours(engines)
    groups: dict[str, list[str]] = {}
    for wl in workloads_in_order(ms):
        groups.setdefault(_group(wl), []).append(wl)
    paths = []
    for group, workloads in groups.items():
        fig, axes = plt.subplots(1, len(workloads), figsize=(max(4.0, 3.2 * len(workloads)), 4.2), squeeze=False)
        for ax, wl in zip(axes[0], workloads):
            cells = [m for m in ms if m["workload"] == wl]
            xs = range(len(cells))
            meds = [m["median"] for m in cells]
            lo = [m["median"] - min(m["values"]) for m in cells]
            hi = [max(m["values"]) - m["median"] for m in cells]
            bars = ax.bar(xs, meds, color=[colours[m["engine"]] for m in cells], yerr=[lo, hi], capsize=3)
            for bar, m in zip(bars, cells):
                if m["noisy"]:
                    bar.set_hatch("//")
                if m.get("limit"):
                    ax.hlines(m["limit"], bar.get_x(), bar.get_x() + bar.get_width(), colors="k", linestyles=":")
            ax.set_xticks(list(xs), [m["engine"] for m in cells], rotation=35, ha="right", fontsize=7)
            unit = cells[0]["unit"]
            ax.set_title(f"{wl}\n({unit}, {'higher' if cells[0]['higher_is_better'] else 'lower'} is better)",
                         fontsize=8)
        fig.suptitle(f"anycore bench compare: {group} (hatched = noisy, dotted = physical limit)", fontsize=9)
        fig.tight_layout()
        path = stem.parent / f"{stem.name}-{group}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
