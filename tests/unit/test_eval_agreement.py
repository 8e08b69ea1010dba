"""`anycore eval agreement` (anycore.eval_agreement): the arithmetic and a run on a tiny model."""

from __future__ import annotations

import pytest

from anycore import LLM
from anycore.eval_agreement import (
    agreement,
    agreement_on_ids,
    first_divergence,
    greedy_continuations,
    teacher_forced_agreement,
)
from tests.models.test_tiny_models import write_checkpoint

PROMPTS = [[5, 17, 33, 99, 4], [9, 9, 9], list(range(10, 40))]


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) == 3
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1  # later agreement does not count
    assert first_divergence([4], [5]) == 0


def test_agreement_counts_positions_before_the_first_divergence():
    ref = [[1, 2, 3, 4], [1, 2, 3, 4]]
    cand = [[1, 2, 3, 4], [1, 9, 3, 4]]
    r = agreement(ref, cand, 4)
    assert r.first_divergence == [4, 1]
    assert r.position_agreement == pytest.approx(5 / 8)
    assert r.identical == 0.5


def test_agreement_rejects_uneven_continuations():
    with pytest.raises(ValueError, match="exactly 4"):
        agreement([[1, 2, 3, 4]], [[1, 2, 3]], 4)
    with pytest.raises(ValueError, match="same, non-zero"):
        agreement([], [], 4)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("tiny-llama")
    write_checkpoint(path, "llama-untied-llama3-rope", tokenizer)
    return path


def test_a_model_agrees_with_itself(tiny_path):
    llm = LLM(model=str(tiny_path), dtype="float32", kv_cache_gb=0.01)
    r = agreement_on_ids(llm, llm, PROMPTS, 12)
    assert r.position_agreement == 1.0 and r.identical == 1.0
    assert r.teacher_forced == 1.0 and r.reference_teacher_forced == 1.0


def test_teacher_forcing_scores_every_position(tiny_path):
    llm = LLM(model=str(tiny_path), dtype="float32", kv_cache_gb=0.01)
    prompt = [5, 6, 7]
    greedy = greedy_continuations(llm, [prompt], 6)[0]
    assert teacher_forced_agreement(llm, [prompt], [greedy]) == 1.0
    # spoil position 2: the model, given the unspoiled prefix, still predicts the greedy token
    # there, so that position must miss (later ones read the spoiled token and may go either way)
    spoiled = list(greedy)
    spoiled[2] = (spoiled[2] + 1) % 256
    assert teacher_forced_agreement(llm, [prompt], [spoiled]) <= 5 / 6


def test_quantized_model_is_scored_against_its_reference(tiny_path):
    ref = LLM(model=str(tiny_path), dtype="float32", kv_cache_gb=0.01)
    cand = LLM(model=str(tiny_path), dtype="float32", quantization="w8a8_int8", kv_cache_gb=0.01)
    r = agreement_on_ids(ref, cand, PROMPTS, 12)
    assert r.prompts == 3 and r.max_tokens == 12
    assert 0.0 <= r.position_agreement <= 1.0 and 0.0 <= r.teacher_forced <= 1.0
    # W8A8 of the same weights predicts most next tokens of the float model
    assert r.teacher_forced > 0.5, r
    assert r.reference_teacher_forced == 1.0  # fp32 prefill and decode pick the same tokens here
