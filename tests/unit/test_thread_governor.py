"""ThreadGovernor: leaves a quiet machine alone, drops threads when that is faster, comes back."""

from __future__ import annotations

from anycore.engine.thread_governor import ThreadGovernor, _candidates


class Machine:
    """Step time as a function of the thread count; `busy` models another process on a core."""

    def __init__(self) -> None:
        self.threads = 4
        self.busy = False
        self.calls: list[int] = []

    def set_threads(self, n: int) -> None:
        self.calls.append(n)
        self.threads = n

    def step_time(self) -> float:
        if self.busy:  # a descheduled thread stalls every barrier: more threads, slower
            return {4: 0.030, 2: 0.020, 1: 0.016}[self.threads]
        return {4: 0.010, 2: 0.013, 1: 0.020}[self.threads]


def _run(gov: ThreadGovernor, m: Machine, steps: int, batch: int = 1) -> None:
    for _ in range(steps):
        gov.observe(batch, m.step_time())


def test_candidates_halve_down_to_one():
    assert _candidates(4) == [4, 2, 1] and _candidates(6) == [6, 3, 1] and _candidates(2) == [2, 1]


def test_quiet_machine_keeps_every_thread_and_never_switches():
    m = Machine()
    gov = ThreadGovernor(4, m.set_threads)
    _run(gov, m, 2000)
    assert gov.threads == 4 and gov.trials == 0 and m.calls == []  # never even set


def test_contention_moves_to_the_fastest_count_then_back_when_it_ends():
    m = Machine()
    gov = ThreadGovernor(4, m.set_threads, recheck=64)
    _run(gov, m, 50)
    m.busy = True
    _run(gov, m, 60)  # patience, then a trial over 4, 2, 1
    assert gov.trials == 1 and gov.threads == 1 and m.threads == 1
    _run(gov, m, 200)  # rechecks while busy keep choosing 1
    assert gov.threads == 1
    m.busy = False
    _run(gov, m, 200)  # the next recheck finds 4 fastest again
    assert gov.threads == 4 and m.threads == 4


def test_steps_of_another_batch_size_do_not_count_in_a_trial():
    m = Machine()
    gov = ThreadGovernor(2, m.set_threads)
    m.threads = 2
    _run(gov, m, 20)
    m.busy = True
    _run(gov, m, 9)  # the trial starts
    assert gov._trial is not None
    for _ in range(50):
        gov.observe(8, 1.0)  # a batch of 8: ignored by the trial
    assert gov._trial is not None
    _run(gov, m, 20)
    assert gov._trial is None and gov.threads == 1


def test_one_thread_configured_is_left_alone():
    m = Machine()
    gov = ThreadGovernor(1, m.set_threads)
    m.busy = True
    _run(gov, m, 100)
    assert m.calls == [] and gov.trials == 0
