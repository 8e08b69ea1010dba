"""quantize_online(lm_head=True): the logits head joins W8A8 on a real (tiny) checkpoint."""

from __future__ import annotations

import torch

from anycore import LLM, SamplingParams
from anycore.layers.quant import linear_method_factory, quantize_online
from tests.models.test_tiny_models import write_checkpoint

PROMPTS = [[5, 17, 33, 99, 4, 250, 7], list(range(10, 40))]


def test_online_quantization_with_int8_head(tmp_path, tokenizer):
    write_checkpoint(tmp_path, "qwen2-qkv-bias", tokenizer)  # tied embeddings
    llm = LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01)
    engine = llm.engine
    ids = list(range(3, 60))
    ref = engine.score(ids)
    quantize_online(engine.model, linear_method_factory("w8a8_int8"), lambda: engine.score(list(range(20, 200))),
                    lm_head=True)
    head = engine.model.lm_head
    assert head.int8_kernel is not None and head.inv_smooth is not None
    assert head.tied_to.weight.dtype == torch.float32  # lookups still read the float embedding
    got = engine.score(ids)
    assert (got - ref).abs().mean() < 0.05 * ref.abs().mean()
    out = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert all(len(o.token_ids) == 8 for o in out)


def test_quantize_lm_head_option(tmp_path, tokenizer):
    """EngineConfig.quantize_lm_head (CLI --quantize-lm-head) quantizes the head at load."""
    write_checkpoint(tmp_path, "llama-untied-llama3-rope", tokenizer)  # untied head
    llm = LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01, quantization="w8a8_int8", quantize_lm_head=True)
    head = llm.engine.model.lm_head
    assert head.int8_kernel is not None and head.weight is None
    plain = LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01, quantization="w8a8_int8")
    assert plain.engine.model.lm_head.int8_kernel is None  # off by default
    ids = list(range(3, 60))
    got, ref = llm.engine.score(ids), plain.engine.score(ids)
    assert (got - ref).abs().mean() < 0.05 * ref.abs().mean()


def test_quantize_lm_head_needs_online_quantization(tmp_path):
    import pytest

    from anycore.cli import main
    from anycore.config import EngineConfig

    with pytest.raises(ValueError, match="needs online quantization"):
        EngineConfig(quantize_lm_head=True)
    assert main(["quantize", "--quantize-lm-head", "--out", str(tmp_path / "q")]) == 2  # not in checkpoints
