"""Offline API behaviour on the default model: n > 1, seeds, logprobs, stops, and bad input."""

from __future__ import annotations

import json

import pytest

from anycore import LLM, SamplingParams
from anycore.errors import ContextLengthExceeded

pytestmark = pytest.mark.slow


def test_n_samples_with_seed_are_reproducible(llm_fp32):
    params = SamplingParams(n=3, temperature=1.0, top_p=0.9, seed=123, max_tokens=12, ignore_eos=True)
    a = llm_fp32.generate(["Tell me a story about a dragon."], params)[0]
    b = llm_fp32.generate(["Tell me a story about a dragon."], params)[0]
    assert len(a.outputs) == 3 and [o.index for o in a.outputs] == [0, 1, 2]
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    assert len({tuple(o.token_ids) for o in a.outputs}) > 1  # different seeds per sample


def test_seeded_request_unaffected_by_batch_neighbours(llm_fp32):
    seeded = SamplingParams(temperature=0.8, seed=5, max_tokens=10, ignore_eos=True)
    alone = llm_fp32.generate(["Colours of the rainbow:"], seeded)[0].token_ids
    other = SamplingParams(temperature=1.0, max_tokens=14, ignore_eos=True)
    together = llm_fp32.generate(["Colours of the rainbow:", "Numbers: one, two,"], [seeded, other])
    assert together[0].token_ids == alone


def test_logprobs_top_n(llm_fp32):
    out = llm_fp32.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=4, logprobs=3))[0]
    assert len(out.logprobs) == 4
    for tok, lp in zip(out.token_ids, out.logprobs):
        assert lp.token_id == tok and len(lp.top) == 3
        assert lp.top[0][0] == tok and abs(lp.top[0][1] - lp.logprob) < 1e-5  # greedy = top-1
        assert lp.logprob <= 0


def test_stop_string_and_stop_token(llm_fp32):
    base = llm_fp32.generate(["1, 2, 3, 4,"], SamplingParams(temperature=0, max_tokens=12))[0]
    assert " 6" in base.text
    cut = llm_fp32.generate(["1, 2, 3, 4,"], SamplingParams(temperature=0, max_tokens=12, stop=[" 6"]))[0]
    assert cut.finish_reason == "stop" and cut.text == base.text[: base.text.index(" 6")]
    stop_id = base.token_ids[2]
    by_id = llm_fp32.generate(["1, 2, 3, 4,"], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_id]))[0]
    assert by_id.token_ids == base.token_ids[:3] and by_id.finish_reason == "stop"


def test_max_tokens_gives_length_finish(llm_fp32):
    out = llm_fp32.generate(["Hello"], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 3


def test_prompt_longer_than_context_is_rejected_without_side_effects(llm_fp32):
    too_long = [100] * llm_fp32.engine.max_model_len
    with pytest.raises(ContextLengthExceeded, match="context"):  # a ValueError
        llm_fp32.generate(["fine prompt", too_long], SamplingParams(max_tokens=2))
    assert not llm_fp32.engine.has_unfinished()
    assert llm_fp32.generate(["still works"], SamplingParams(temperature=0, max_tokens=2))[0].token_ids


def test_invalid_token_ids_and_empty_prompt(llm_fp32):
    with pytest.raises(ValueError, match="token ids"):
        llm_fp32.generate([[1, 2, 10**7]], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="empty"):
        llm_fp32.generate([""], SamplingParams(max_tokens=2))


def test_unknown_model_path():
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM(model="/nonexistent/model.gguf")


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["GPT2LMHeadModel"], "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
        "num_hidden_layers": 1, "num_attention_heads": 2,
    }))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'"):
        LLM(model=str(tmp_path))
