"""Statistics for `anycore bench compare`: medians, spread, noise flags, ratios, interleaving.

Pure Python, no torch: the harness logic is unit-tested without running a benchmark.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

# A run is "noisy" when other processes used more than this many cores on average while it ran,
# or when its repeats spread more than this coefficient of variation.
NOISE_OTHER_CORES = 0.15
NOISE_CV = 0.10


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


def cv(values: Sequence[float]) -> float:
    """Coefficient of variation (sample stdev / mean); 0 for fewer than two values or a zero mean."""
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    if mean == 0:
        return 0.0
    return float(statistics.stdev(values) / abs(mean))


@dataclass(frozen=True)
class NoiseCheck:
    noisy: bool
    reasons: tuple[str, ...]


def noise_check(values: Sequence[float], other_cores: Sequence[float], max_other_cores: float = NOISE_OTHER_CORES,
                max_cv: float = NOISE_CV) -> NoiseCheck:
    """Flags a measurement whose repeats disagree or that shared the CPU with other work.

    ``other_cores``: per repeat, the mean number of cores other processes kept busy meanwhile.
    """
    reasons = []
    spread = cv(values)
    if spread > max_cv:
        reasons.append(f"cv {spread:.0%} > {max_cv:.0%}")
    busiest = max(other_cores, default=0.0)
    if busiest > max_other_cores:
        reasons.append(f"other load {busiest:.2f} cores > {max_other_cores:g}")
    return NoiseCheck(bool(reasons), tuple(reasons))


def ratio(ours: float | None, theirs: float | None, higher_is_better: bool = True) -> float | None:
    """anycore/peer for a throughput; for a latency (lower is better) the same quotient.

    The quotient is always ours/theirs so the column reads one way; whether > 1 is good depends
    on the metric's direction, shown beside it. None when either side is missing or zero.
    """
    del higher_is_better  # direction is displayed, not folded into the number
    if ours is None or theirs is None or theirs == 0:
        return None
    return ours / theirs


def interleave(engines: Sequence[T], repeats: int) -> list[tuple[int, T]]:
    """(repeat, engine) pairs in A B C A B C ... order, so slow drifts in machine state (thermal,
    other tenants, page cache) hit every engine alike instead of biasing whichever ran last."""
    return [(r, e) for r in range(repeats) for e in engines]


def fmt_num(x: float | None, digits: int = 3) -> str:
    """Compact fixed-width friendly number: 3 significant digits, no exponent for usual ranges."""
    if x is None:
        return "-"
    ax = abs(x)
    if ax >= 1000:
        return f"{x:.0f}"
    if ax >= 100:
        return f"{x:.1f}" if digits > 3 else f"{x:.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"

