"""What a decode-shaped step costs on this machine, measured, and the draft length it pays for.

Why measured: whether verifying 1 + k tokens is "about one step" depends on the weights' format
and the machine, not on a constant. SmolLM2-135M on 2 Zen 4 cores: a bf16 verify of 1 + 3 tokens
costs ~1.1x a plain batch-1 step (the step reads bf16 weights: bandwidth-bound), the same verify
on the Q4_1 blocks ~1.8x (the int8 block kernels are compute-bound: every extra row costs), and
at batch 16 a step of 16 + 16 draft rows ~2x one of 16. A fixed k is right for one of these and
wrong for the others.

How: ``StepCosts`` keeps, per number of rows a step computed (one per plain decode, 1 + k per
verify), the median of its recent wall times (decode-shaped steps only: no prefill chunk beside
them). ``best_draft_len`` picks the k that maximises a batch's expected tokens per second,

    (B - 1 + E_k(a)) / T(B + k),    E_k(a) = 1 + a + ... + a^k,

for a request in a batch of B with per-token acceptance a (the chance each next draft token is
kept given the previous was: the chain stops at the first rejection). k = 0 is a plain step.
Row counts never measured are interpolated between measured ones; above the largest measured
the last segment's slope continues, or the cost stays flat while only one count is known (so an
untried k looks cheap, gets tried, and is then measured: exploration by optimism).
"""

from __future__ import annotations

import statistics
from collections import deque

_WINDOW = 15  # recent steps a row count's median is taken over


class StepCosts:
    def __init__(self) -> None:
        self._times: dict[int, deque[float]] = {}
        self._median: dict[int, float] = {}

    def record(self, rows: int, seconds: float) -> None:
        times = self._times.setdefault(rows, deque(maxlen=_WINDOW))
        times.append(seconds)
        self._median[rows] = statistics.median(times)

    @property
    def measured(self) -> bool:
        return bool(self._median)

    def estimate(self, rows: int) -> float | None:
        """Seconds of a step of ``rows`` rows, or None before any step was measured."""
        if not self._median:
            return None
        if rows in self._median:
            return self._median[rows]
        known = sorted(self._median)
        below = [n for n in known if n < rows]
        above = [n for n in known if n > rows]
        if below and above:
            lo, hi = below[-1], above[0]
            tl, th = self._median[lo], self._median[hi]
            return tl + (th - tl) * (rows - lo) / (hi - lo)
        if above:  # (fewer rows than any measured: no cheaper than the smallest known)
            return self._median[above[0]]
        if len(known) == 1:
            return self._median[known[0]]
        lo, hi = known[-2], known[-1]
        slope = max(0.0, (self._median[hi] - self._median[lo]) / (hi - lo))
        return self._median[hi] + slope * (rows - hi)

    def best_draft_len(self, batch_size: int, acceptance: float, max_len: int, rows_per_token: int = 1) -> int:
        """The k in 0 .. max_len with the most expected tokens per second (see the module
        docstring); ``max_len`` before anything is measured. A tree draft computes
        ``rows_per_token`` rows per level (its top-k), its acceptance is per level."""
        if self.estimate(batch_size) is None:
            return max_len
        best_k, best_rate = 0, 0.0
        expected = 1.0  # E_k(a)
        for k in range(max_len + 1):
            if k:
                expected += acceptance**k
            seconds = self.estimate(batch_size + k * rows_per_token)
            assert seconds is not None
            rate = (batch_size - 1 + expected) / max(seconds, 1e-9)
            if rate > best_rate * (1.0 + 1e-9):
                best_k, best_rate = k, rate
        return best_k

    def snapshot(self) -> dict[int, float]:
        """Median seconds by row count (diagnostics, the bench)."""
        return dict(sorted(self._median.items()))
