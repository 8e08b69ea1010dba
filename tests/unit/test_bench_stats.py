"""bench compare statistics: median, CV, noise check, ratios, interleaving, number formatting."""

from __future__ import annotations

import pytest

from anycore.bench.stats import cv, fmt_num, interleave, median, noise_check, ratio


def test_median_odd_even_and_empty():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5
    with pytest.raises(ValueError):
        median([])


def test_cv():
    assert cv([5.0]) == 0.0
    assert cv([2.0, 2.0, 2.0]) == 0.0
    assert cv([0.0, 0.0]) == 0.0
    assert cv([90.0, 110.0]) == pytest.approx(14.142 / 100, rel=1e-3)  # stdev 14.14 over mean 100


def test_noise_check_quiet_run_passes():
    c = noise_check([100.0, 101.0, 99.0], [0.01, 0.05, 0.1])
    assert not c.noisy and c.reasons == ()


def test_noise_check_flags_other_load():
    c = noise_check([100.0, 100.0], [0.0, 0.4])
    assert c.noisy and "other load 0.40 cores" in c.reasons[0]


def test_noise_check_flags_spread_and_both():
    c = noise_check([80.0, 120.0], [0.0])
    assert c.noisy and c.reasons[0].startswith("cv")
    both = noise_check([80.0, 120.0], [1.0])
    assert len(both.reasons) == 2


def test_noise_thresholds_are_parameters():
    assert not noise_check([80.0, 120.0], [0.3], max_other_cores=0.5, max_cv=0.5).noisy


def test_interleave_order_is_round_robin():
    assert interleave(["A", "B", "C"], 2) == [(0, "A"), (0, "B"), (0, "C"), (1, "A"), (1, "B"), (1, "C")]
    assert interleave(["A"], 0) == []


def test_ratio():
    assert ratio(200.0, 100.0) == 2.0
    assert ratio(50.0, 100.0, higher_is_better=False) == 0.5  # always ours/theirs
    assert ratio(None, 1.0) is None and ratio(1.0, 0.0) is None


def test_fmt_num():
    assert fmt_num(None) == "-"
    assert fmt_num(1234.6) == "1235"
    assert fmt_num(164.46) == "164"
    assert fmt_num(42.53) == "42.5"
    assert fmt_num(0.1234) == "0.123"
