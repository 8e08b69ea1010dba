"""Scoring and perplexity on the default model agree with transformers."""

from __future__ import annotations

import math

import pytest
import torch

from anycore.eval_perplexity import perplexity

pytestmark = pytest.mark.slow


def test_score_matches_transformers_and_chunking(llm_fp32, hf_model):
    engine = llm_fp32.engine
    ids = engine.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 6)
    ours = engine.score(ids)
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].log_softmax(-1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert torch.allclose(ours, ref, atol=1e-3)
    saved = engine.scheduler.max_num_batched_tokens
    engine.scheduler.max_num_batched_tokens = 7  # same result prefilled 7 tokens at a time
    try:
        assert torch.allclose(engine.score(ids), ours, atol=1e-4)
    finally:
        engine.scheduler.max_num_batched_tokens = saved


def test_perplexity_is_exp_mean_nll_of_second_halves(llm_fp32):
    engine = llm_fp32.engine
    ids = engine.tokenizer.encode("Perplexity measures how well a model predicts text. " * 20)[:128]
    r = perplexity(engine, ids, ctx=64)
    lp = torch.cat([engine.score(ids[i : i + 64])[31:] for i in (0, 64)])
    assert r.tokens_scored == lp.numel() == 64  # tokens 32..63 of each window
    assert math.isclose(r.perplexity, math.exp(-lp.double().mean().item()), rel_tol=1e-6)
