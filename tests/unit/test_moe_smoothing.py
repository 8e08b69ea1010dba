"""Smoothing of a sparse MLP's experts (anycore.layers.quant.moe_smoothing): exact in float,
helpful under W8A8 where the post-attention norm has outlier channels."""

from __future__ import annotations

import pytest
import torch

from anycore import LLM, SamplingParams
from anycore.layers.moe import SparseMoeBlock
from anycore.layers.quant.moe_smoothing import smooth_sparse_mlp
from anycore.layers.quant.smoothing import ALPHA_GRID, collect_input_stats
from anycore.models.moe import MoeForCausalLM
from tests.models.test_moe_models import PROMPTS, _configs, write_checkpoint


@pytest.mark.parametrize("name", sorted(_configs()))
def test_sparse_mlp_smoothing_leaves_the_float_model_unchanged(tmp_path, tokenizer, name):
    """The norm's factor reaches every reader (experts' gate/up, router, Qwen2-MoE's shared
    expert and its gate) and each expert's down factor its up rows: the float model computes
    what it did."""
    write_checkpoint(tmp_path, name, tokenizer)
    engine = LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01).engine
    ids = list(range(3, 70))
    ref = engine.score(ids)
    items = engine.model.sparse_mlp_smoothing()
    sparse_layers = [la for la in engine.model.layers if isinstance(la.mlp, SparseMoeBlock)]
    assert sparse_layers and [m.block for m in items] == [la.mlp for la in sparse_layers]
    assert all(m.norm.data_ptr() == la.post_attention_layernorm.weight.data_ptr() for m, la in zip(items, sparse_layers))
    stats = collect_input_stats([m.block.gate for m in items], lambda: engine.score(list(range(20, 200))), stride=1)
    before = [[t.clone() for t in (m.norm, m.block.experts.w13, m.block.experts.w2, m.block.gate.weight)]
              for m in items]
    for m in items:
        used = smooth_sparse_mlp(m, stats[id(m.block.gate)], alpha=0.5)
        assert used[0] == 0.5 and len(used) > 1, used  # the norm side and at least one expert's down
    for old, m in zip(before, items):  # every tensor moved (a no-op would pass the check below)
        for b, t in zip(old, (m.norm, m.block.experts.w13, m.block.experts.w2, m.block.gate.weight)):
            assert not torch.allclose(b, t)
    torch.testing.assert_close(engine.score(ids), ref, rtol=1e-4, atol=1e-4)

    # the searched alphas come from the grid, None where a place is left unsmoothed
    engine2 = LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01).engine
    items2 = engine2.model.sparse_mlp_smoothing()
    stats2 = collect_input_stats([m.block.gate for m in items2], lambda: engine2.score(list(range(20, 200))), stride=1)
    for m in items2:
        assert set(smooth_sparse_mlp(m, stats2[id(m.block.gate)])) <= {*ALPHA_GRID, None}
    torch.testing.assert_close(engine2.score(ids), ref, rtol=1e-4, atol=1e-4)


def _with_outlier_channels(folder) -> None:
    """The sparse layers' post-attention norm weights made positive with three channels 50x the
    rest: activation outliers as trained models have them (random init has none)."""
    from safetensors.torch import load_file, save_file

    w = load_file(str(folder / "model.safetensors"))
    for k in w:
        if k.endswith("post_attention_layernorm.weight"):
            w[k] = w[k].abs() + 0.1
            w[k][torch.tensor([3, 17, 40])] *= 50
    save_file(w, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _logprob_error(reference: LLM, llm: LLM) -> float:
    """Median over positions of the largest |logprob difference| from ``reference``,
    teacher-forced on its greedy continuations of PROMPTS."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    worst = []
    for prompt, out in zip(PROMPTS, reference.generate(PROMPTS, params)):
        ids = prompt + out.token_ids
        a, b = reference.engine.next_token_logprobs(ids), llm.engine.next_token_logprobs(ids)
        worst.append((a.float() - b.float()).abs().amax(-1))
    return float(torch.cat(worst).median())


@pytest.mark.parametrize("name", ["mixtral", "qwen3-moe"])
def test_smoothed_w8a8_experts_are_closer_to_bf16_with_outlier_channels(tmp_path, tokenizer, name, monkeypatch):
    """Measured on avx512_vnni (median max |logprob diff| vs bf16, 84 positions): mixtral 0.017
    smoothed vs 0.035 unsmoothed, qwen3-moe 0.023 vs 0.041, olmoe 0.020 vs 0.038, qwen2-moe
    0.016 vs 0.022; without the outliers mixtral 0.013 vs 0.015, qwen2-moe 0.012 vs 0.012."""
    write_checkpoint(tmp_path, name, tokenizer)
    _with_outlier_channels(tmp_path)
    bf16 = LLM(model=str(tmp_path), dtype="bfloat16", kv_cache_gb=0.01)
    smoothed = _logprob_error(bf16, LLM(model=str(tmp_path), dtype="bfloat16", quantization="w8a8_int8",
                                        kv_cache_gb=0.01))
    monkeypatch.setattr(MoeForCausalLM, "sparse_mlp_smoothing", lambda self: [])
    unsmoothed = _logprob_error(bf16, LLM(model=str(tmp_path), dtype="bfloat16", quantization="w8a8_int8",
                                          kv_cache_gb=0.01))
    assert smoothed < 0.75 * unsmoothed, (smoothed, unsmoothed)
