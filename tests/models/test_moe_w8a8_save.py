"""A W8A8 Mixture-of-Experts model saved as compressed-tensors and loaded back: per expert and
projection an int8 ``weight`` and a ``weight_scale [N, 1]`` under the architecture's own names
(Mixtral: ``block_sparse_moe.experts.<e>.w1``), routers left float and listed in ``ignore``; the
reloaded model computes exactly what the online-quantized one did."""

from __future__ import annotations

import json

import pytest
import torch

from anycore import LLM, SamplingParams
from anycore.layers.moe import StackedExperts
from anycore.layers.quant.compressed_tensors import method_of
from anycore.quantize import save_quantized
from tests.models.test_moe_models import PROMPTS, write_checkpoint

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.mark.parametrize("name, expert, router", [
    ("mixtral", "model.layers.1.block_sparse_moe.experts.7.w3", "model.layers.1.block_sparse_moe.gate.weight"),
    ("qwen2-moe-shared-expert", "model.layers.1.mlp.experts.3.gate_proj", "model.layers.1.mlp.gate.weight"),
])
def test_w8a8_moe_saved_and_reloaded_computes_the_same(tmp_path, tokenizer, name, expert, router):
    from safetensors import safe_open

    src, out = tmp_path / "src", tmp_path / "w8a8"
    write_checkpoint(src, name, tokenizer)
    online = LLM(model=str(src), dtype="bfloat16", quantization="w8a8_int8", kv_cache_gb=0.01)
    save_quantized(online.engine, out)
    cfg = json.loads((out / "config.json").read_text())
    assert method_of(cfg["quantization_config"]) == "w8a8_int8"
    assert "re:.*mlp.gate$" in cfg["quantization_config"]["ignore"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        q, s = f.get_tensor(expert + ".weight"), f.get_tensor(expert + ".weight_scale")
        assert q.dtype == torch.int8 and s.dtype == torch.float32 and s.shape == (q.shape[0], 1)
        assert f.get_tensor(router).dtype == torch.bfloat16  # routers stay float
    assert not any(n.endswith((".w13", ".w2", "w13_scale", "w2_scale")) for n in names)  # no stacked internals

    reloaded = LLM(model=str(out), dtype="bfloat16", kv_cache_gb=0.01)  # no flag: the checkpoint says so
    assert reloaded.engine.quantization == "w8a8_int8"
    pairs = zip([m for m in online.engine.model.modules() if isinstance(m, StackedExperts)],
                [m for m in reloaded.engine.model.modules() if isinstance(m, StackedExperts)], strict=True)
    for a, b in pairs:
        assert b.int8_kernel is reloaded.engine.ops.fused_moe_w8a8
        assert all(torch.equal(x, y) for x, y in zip(a.int8_experts(), b.int8_experts(), strict=True))
    assert ([o.token_ids for o in online.generate(PROMPTS, GREEDY)]
            == [o.token_ids for o in reloaded.generate(PROMPTS, GREEDY)])
    ids = PROMPTS[0] + list(range(20, 30))
    assert torch.equal(online.engine.next_token_logprobs(ids), reloaded.engine.next_token_logprobs(ids))


def test_a_prequantized_expert_must_be_int8_and_complete():
    from anycore.kernels.ops import torch_native_ops

    experts = StackedExperts(2, 16, 8, 1, True, torch_native_ops(), torch.bfloat16, int8=True)
    with pytest.raises(ValueError, match="must be int8"):
        experts.load_stacked("0.gate_proj.weight", torch.zeros(8, 16))
    experts.load_stacked("0.gate_proj.weight", torch.ones(8, 16, dtype=torch.int8))
    experts.load_stacked("0.gate_proj.weight_scale", torch.full((8, 1), 0.5))
    assert (experts.w13_scale[0, :8] == 0.5).all() and (experts.w13[0, :8] == 1).all()
    missing = experts.missing_tensors()
    assert "0.up_proj.weight_scale" in missing and "0.gate_proj.weight_scale" not in missing
    float_experts = StackedExperts(2, 16, 8, 1, True, torch_native_ops(), torch.bfloat16)
    with pytest.raises(ValueError, match="not an expert projection weight"):
        float_experts.load_stacked("0.gate_proj.weight_scale", torch.ones(8, 1))
