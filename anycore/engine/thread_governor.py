"""How many of the configured threads decode steps use, chosen from their measured times.

Why: the kernels' threads meet at barriers (five per layer in the decode team), so when other
processes take cores, a thread that loses its core stalls every barrier. Measured here (2 cores,
SmolLM2 bf16 decode): 77 tok/s on 2 threads alone, 25 with one busy process beside it, while 1
thread kept 54. A fixed thread count is either slow on a quiet machine or fragile on a busy one.

How: each decode step's time is compared with the best recent time for its batch size. After
``patience`` consecutive steps slower than ``slowdown`` x that, the governor runs a trial: a few
steps at each candidate count (the maximum, halvings of it, 1), back to back so all see the same
machine, and keeps the fastest. While below the maximum it re-runs the trial every ``recheck``
decode steps (and only then), so the threads come back when the other work goes. A quiet machine
never leaves the maximum and pays nothing but a comparison per step.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def _candidates(max_threads: int) -> list[int]:
    out, n = [], max_threads
    while n >= 1:
        out.append(n)
        n //= 2
    return out if out[-1] == 1 else [*out, 1]


class ThreadGovernor:
    def __init__(self, max_threads: int, set_threads: Callable[[int], None] = torch.set_num_threads,
                 slowdown: float = 1.5, patience: int = 8, trial_steps: int = 4, recheck: int = 256) -> None:
        self.max_threads = max_threads
        self.threads = max_threads
        self._set = set_threads
        self.slowdown, self.patience, self.trial_steps, self.recheck = slowdown, patience, trial_steps, recheck
        self._best: dict[int, float] = {}  # batch size -> best recent step time at self.threads
        self._slow = 0
        self._since_trial = 0
        self._trial: list[tuple[int, list[float]]] | None = None  # (threads, step times) per candidate
        self._trial_key = 0
        self._pos = 0
        self.trials = 0  # trials run so far (diagnostics, tests)

    def observe(self, batch_size: int, seconds: float) -> None:
        """Called after every decode step (one new token per request) with its wall time."""
        if self.max_threads <= 1:
            return
        if self._trial is not None:
            self._trial_step(batch_size, seconds)
            return
        self._since_trial += 1
        best = self._best.get(batch_size)
        # the best time drifts up 0.1% a step, so slow growth (longer contexts) is not a slowdown
        self._best[batch_size] = seconds if best is None else min(best * 1.001, seconds)
        self._slow = self._slow + 1 if best is not None and seconds > self.slowdown * best else 0
        # Below the maximum the machine is busy already and step times swing with the other
        # work's time slices: only the periodic recheck runs trials there.
        at_max = self.threads == self.max_threads
        if (at_max and self._slow >= self.patience) or (not at_max and self._since_trial >= self.recheck):
            self._start_trial(batch_size)

    def _start_trial(self, key: int) -> None:
        self.trials += 1
        self._trial = [(n, []) for n in _candidates(self.max_threads)]
        self._trial_key = key
        self._pos = 0
        self._use(self._trial[0][0])

    def _trial_step(self, key: int, seconds: float) -> None:
        assert self._trial is not None
        if key != self._trial_key:  # another batch size: not comparable, not counted
            return
        times = self._trial[self._pos][1]
        times.append(seconds)
        if len(times) <= self.trial_steps:  # the first step after a switch is a warm-up
            return
        self._pos += 1
        if self._pos < len(self._trial):
            self._use(self._trial[self._pos][0])
            return
        medians = {n: statistics.median(t[1:]) for n, t in self._trial}
        chosen = min(medians, key=lambda n: (medians[n], -n))  # ties: more threads
        self._trial = None
        self._use(chosen)
        self._best = {key: medians[chosen]}
        self._slow = 0
        self._since_trial = 0

    def _use(self, n: int) -> None:
        self._set(n)
        self.threads = n
