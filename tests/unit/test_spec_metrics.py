"""Speculative decoding's counters in the engine snapshot and in /metrics."""

from __future__ import annotations

import pytest

from anycore.config import EngineConfig
from anycore.outputs import EngineStats
from anycore.server.metrics import ServerMetrics


def test_acceptance_rate_and_length_are_rendered():
    stats = EngineStats(spec_verify_steps=10, spec_draft_tokens=40, spec_accepted_tokens=25)
    assert stats.spec_acceptance_rate == 25 / 40 and stats.spec_acceptance_length == 1 + 25 / 10
    text = ServerMetrics().render(stats, 1, 0, "m", True)
    values = dict(line.split(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert values["anycore_spec_decode_draft_tokens_total"] == "40"
    assert values["anycore_spec_decode_accepted_tokens_total"] == "25"
    assert float(values["anycore_spec_decode_acceptance_rate"]) == pytest.approx(0.625)
    assert float(values["anycore_spec_decode_acceptance_length"]) == pytest.approx(3.5)
    assert EngineStats().spec_acceptance_length == 0.0  # no verify step yet


@pytest.mark.parametrize("bad", [dict(speculative_algorithm="medusa"), dict(speculative_algorithm="ngram",
                                 num_speculative_tokens=0), dict(speculative_algorithm="ngram",
                                 ngram_prompt_lookup_min=5, ngram_prompt_lookup_max=3),
                                 dict(speculative_algorithm="draft"),  # neither a model nor layers
                                 dict(speculative_algorithm="draft", speculative_model="m", speculative_draft_layers=2),
                                 dict(speculative_algorithm="ngram", speculative_draft_layers=2)])
def test_bad_speculative_settings_are_refused(bad):
    with pytest.raises(ValueError):
        EngineConfig(**bad)
