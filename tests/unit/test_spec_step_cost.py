"""The measured step-cost model behind the draft length (spec/step_cost.py) and the policy that
uses it: k chosen for expected tokens per second, backed off where verification is not free."""

from __future__ import annotations

import pytest

from anycore.spec.policy import SpeculativeConfig, Speculator
from anycore.spec.step_cost import StepCosts
from tests.unit.test_spec_scheduler import PROMPT, req, sched, target_says


def costs(seconds_by_rows: dict[int, float]) -> StepCosts:
    c = StepCosts()
    for rows, seconds in seconds_by_rows.items():
        c.record(rows, seconds)
    return c


def test_estimate_interpolates_extrapolates_and_is_none_before_any_step():
    assert StepCosts().estimate(3) is None
    c = costs({1: 1.0, 4: 2.5})
    assert c.estimate(1) == 1.0 and c.estimate(4) == 2.5
    assert c.estimate(2) == pytest.approx(1.5) and c.estimate(3) == pytest.approx(2.0)
    assert c.estimate(6) == pytest.approx(3.5)  # the last segment's slope continues
    assert costs({4: 2.0}).estimate(9) == 2.0  # one count known: flat (untried rows look cheap)
    assert costs({4: 2.0}).estimate(1) == 2.0  # fewer rows cost no less than the smallest known


def test_estimate_is_the_median_of_recent_steps():
    c = StepCosts()
    for seconds in (1.0, 1.1, 50.0, 0.9, 1.05):  # one step hit by another process
        c.record(1, seconds)
    assert c.estimate(1) == 1.05


def test_bandwidth_bound_steps_draft_the_most_compute_bound_steps_none():
    free = costs({n: 1.0 + 0.02 * (n - 1) for n in range(1, 10)})
    assert free.best_draft_len(1, 0.8, 5) == 5
    assert free.best_draft_len(1, 0.1, 5) in (1, 2)  # little to gain, but nearly free
    linear = costs({n: float(n) for n in range(1, 10)})  # every row costs a whole step
    for a in (0.3, 0.8, 0.99):
        assert linear.best_draft_len(1, a, 5) == 0


def test_the_q4_shape_pays_only_with_high_acceptance():
    # verify cost on the default model's Q4_1 blocks, 2 cores: 1 + 3 rows 1.8x, 1 + 5 2.14x a step
    q4 = costs({1: 1.0, 2: 1.35, 4: 1.8, 6: 2.14})
    assert q4.best_draft_len(1, 0.35, 5) == 0  # open chat: ~1.5 tokens a verify
    assert q4.best_draft_len(1, 0.8, 5) >= 3  # copying a given text


def test_a_large_batch_backs_off_where_a_small_one_drafts():
    # a step's time: a fixed part (weights read once) plus a part per row (compute)
    c = costs({n: 1.0 + 0.2 * n for n in range(1, 40)})
    assert c.best_draft_len(1, 0.7, 3) == 3
    assert c.best_draft_len(16, 0.7, 3) == 0  # 16 + 1 rows: 0.7 tokens more for 5% more time


def test_tree_levels_cost_their_nodes():
    c = costs({n: 1.0 + 0.1 * n for n in range(1, 40)})
    chain = c.best_draft_len(1, 0.7, 4)
    tree = c.best_draft_len(1, 0.7, 4, rows_per_token=4)
    assert tree < chain


def test_untried_draft_lengths_look_cheap_until_measured():
    # only plain steps so far: the full k is tried (and then measured)
    assert costs({1: 1.0}).best_draft_len(1, 0.5, 4) == 4
    assert StepCosts().best_draft_len(1, 0.5, 4) == 4


def test_scheduler_stops_drafting_where_verification_costs_a_step_per_row_then_probes_again():
    s = sched(budget=256, min_acceptance=0.0, ngram_min=1)
    spec = s.speculator
    for n in range(1, 8):
        spec.record_step(n, float(n))
    r = req("a", PROMPT * 8, max_tokens=400)
    s.add(r)
    s.update(s.schedule(), {"a": [4]})
    drafted = []
    for _ in range(40):
        out = s.schedule()
        (x,) = out.scheduled
        drafted.append(len(x.draft_tokens))
        s.update(out, target_says(out, {"a": [x.draft_tokens[0] if x.draft_tokens else 5] * 8}))
    assert drafted[0] == 4  # the first proposal probes with the configured k
    assert drafted[1] == 0  # then the cost model says no draft pays
    assert 2 <= sum(d > 0 for d in drafted) <= 4  # probes after growing back-offs (4, 8, 16), nothing else
    assert r.spec_state.backoff >= 16
    assert 2 <= sum(d > 0 for d in drafted) <= 6  # probes after growing back-offs, nothing else
    assert r.spec_state.backoff >= 8


def test_scheduler_keeps_drafting_where_verification_is_nearly_free():
    s = sched(budget=256, min_acceptance=0.0, ngram_min=1)
    for n in range(1, 8):
        s.speculator.record_step(n, 1.0 + 0.01 * n)
    r = req("a", PROMPT * 8, max_tokens=400)
    s.add(r)
    s.update(s.schedule(), {"a": [4]})
    drafted = []
    for _ in range(20):
        out = s.schedule()
        (x,) = out.scheduled
        drafted.append(len(x.draft_tokens))
        s.update(out, target_says(out, {"a": [x.draft_tokens[0] if x.draft_tokens else 5] * 8}))
    assert all(d > 0 for d in drafted)


def test_a_seeded_sampler_drafts_the_configured_k_whatever_the_costs():
    spec = Speculator(SpeculativeConfig(num_tokens=3))
    for n in range(1, 8):
        spec.record_step(n, float(n))
    from anycore.sampling_params import SamplingParams
    from anycore.scheduler.request import Request
    r = Request("s", list(PROMPT), SamplingParams(max_tokens=50, temperature=0.8, seed=7))
    r.append_token(4)
    assert [spec._draft_len(r, 8, 1) for _ in range(3)] == [3, 3, 3]
