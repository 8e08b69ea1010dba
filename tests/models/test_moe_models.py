"""Mixture-of-Experts architectures on small random checkpoints written here, vs transformers.

Each config is tiny (hidden 64, 8 experts, 2 layers) and exercises what its model defines:
Qwen3-MoE per-head q/k norm with norm_topk_prob and one dense layer (mlp_only_layers), Qwen2-MoE
q/k/v bias and the sigmoid-gated shared expert with a dense layer by decoder_sparse_step, Mixtral
renormalised top-2, OLMoE q/k norm over the whole projection with unnormalised top-k. Prompts of
one token (top-k > tokens) and 1-token decode steps leave most experts without a token.
"""

from __future__ import annotations

import pytest
import torch

from anycore import LLM, SamplingParams
from anycore.layers.moe import SparseMoeBlock
from tests.models.hf_oracle import hf_greedy
from tests.native_support import missing, stack_ops

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
PROMPTS = [[5, 17, 33, 99, 4, 250, 7], [9], list(range(10, 50))]


def _configs():
    from transformers import MixtralConfig, OlmoeConfig, Qwen2MoeConfig, Qwen3MoeConfig

    return {
        "qwen3-moe": (Qwen3MoeConfig, dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
                                           norm_topk_prob=True, mlp_only_layers=[1], head_dim=32)),
        "qwen2-moe-shared-expert": (Qwen2MoeConfig, dict(
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
            decoder_sparse_step=2, num_hidden_layers=3)),
        "mixtral": (MixtralConfig, dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=48,
                                        sliding_window=None)),
        "olmoe": (OlmoeConfig, dict(num_experts=8, num_experts_per_tok=4, intermediate_size=40)),
    }


def write_checkpoint(folder, name, tokenizer, **overrides):
    from transformers import AutoModelForCausalLM

    cls, extra = _configs()[name]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cls(**(COMMON | extra | overrides)), dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():  # larger than init so logits are not near-ties
            p.normal_(0, 0.2)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model.eval()


@pytest.mark.parametrize("name", sorted(_configs()))
def test_random_moe_checkpoint_matches_transformers(tmp_path, tokenizer, name):
    hf = write_checkpoint(tmp_path, name, tokenizer)
    llm = LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01)
    model = llm.engine.model
    assert model.config.moe is not None
    if llm.engine.ops.decoder_stack is not None and not missing(llm.engine, stack_ops(None, moe=True)):
        # the sparse layers run in the native stack
        assert llm.engine.runner.native.stack(torch.float32) is not None
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = [hf_greedy(hf, p, 12) for p in PROMPTS]
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == expected
    # prompt logprobs of the whole sequence agree too, not only the argmax chain
    ids = PROMPTS[0] + expected[0]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].log_softmax(-1)
    torch.testing.assert_close(llm.engine.next_token_logprobs(ids), ref, atol=1e-4, rtol=1e-4)
    # and with prefill chunked to 3 tokens per step (fewer tokens than top-k in a chunk)
    llm.engine.scheduler.max_num_batched_tokens = 3
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == expected


def test_checkpoint_missing_an_expert_is_refused(tmp_path, tokenizer):
    from safetensors.torch import load_file, save_file

    write_checkpoint(tmp_path, "mixtral", tokenizer)
    w = load_file(str(tmp_path / "model.safetensors"))
    del w["model.layers.1.block_sparse_moe.experts.5.w3.weight"]
    save_file(w, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"layers\.1\.mlp\.experts\.5\.up_proj\.weight"):
        LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01)


@pytest.mark.parametrize("name", ["qwen2-moe-shared-expert"])  # (the others measured once, below)
def test_w8a8_moe_stays_close_to_bf16(tmp_path, tokenizer, name):
    """Online W8A8 with int8 experts (per output channel, per-token activations; the kernel
    table's fused_moe_w8a8, native int8 kernels where the host has them) vs the bf16 model,
    teacher-forced on the bf16 greedy continuations of PROMPTS (84 positions). Measured on
    avx512_vnni: mixtral top-1 79/84, per-position max |logprob diff| median 0.013, max 0.047;
    qwen2-moe 83/84, 0.012, 0.027 (qwen3-moe 81/84, 0.018, 0.071; olmoe 82/84, 0.014, 0.032).
    For scale, bf16 vs fp32 on the same random models: mixtral 80/84, 0.007, 0.051; qwen2-moe
    83/84, 0.006, 0.009 (random weights leave near-ties that any rounding flips)."""
    write_checkpoint(tmp_path, name, tokenizer)
    bf16 = LLM(model=str(tmp_path), dtype="bfloat16", kv_cache_gb=0.01)
    w8a8 = LLM(model=str(tmp_path), dtype="bfloat16", quantization="w8a8_int8", kv_cache_gb=0.01)
    blocks = [m for m in w8a8.engine.model.modules() if isinstance(m, SparseMoeBlock)]
    assert blocks and all(b.experts.w13.dtype == torch.int8 and b.experts.w2_scale is not None for b in blocks)
    ops = w8a8.engine.ops
    assert all(b.experts.int8_kernel is ops.fused_moe_w8a8 for b in blocks)  # packed for the op that runs them
    assert all(b.gate.weight.dtype == torch.bfloat16 for b in blocks)  # routers stay float
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    top1 = positions = 0
    worst = []
    for prompt, out in zip(PROMPTS, bf16.generate(PROMPTS, params)):
        ids = prompt + out.token_ids
        a, b = bf16.engine.next_token_logprobs(ids), w8a8.engine.next_token_logprobs(ids)
        top1 += int((a.argmax(-1) == b.argmax(-1)).sum())
        positions += a.shape[0]
        worst.append((a.float() - b.float()).abs().amax(-1))
    worst = torch.cat(worst)
    assert top1 >= 0.9 * positions, (top1, positions)
    assert worst.median() < 0.04 and worst.max() < 0.2, worst


def test_stacked_experts_refuse_tensors_that_fit_nowhere():
    from anycore.kernels.ops import torch_native_ops
    from anycore.layers.moe import StackedExperts

    experts = StackedExperts(4, 16, 8, 2, True, torch_native_ops(), torch.float32)
    experts.load_stacked("2.w1.weight", torch.ones(8, 16))  # Mixtral's name for gate_proj
    experts.load_stacked("up_exps.weight", torch.full((4, 8, 16), 2.0))  # GGUF: all experts at once
    assert (experts.w13[2, :8] == 1).all() and (experts.w13[:, 8:] == 2).all()
    assert "2.down_proj.weight" in experts.missing_tensors() and "2.gate_proj.weight" not in experts.missing_tensors()
    for name, shape, match in [("4.gate_proj.weight", (8, 16), "expert 4 >= num_experts 4"),
                               ("1.down_proj.weight", (8, 16), "checkpoint shape"),
                               ("1.gate_proj.bias", (8,), "not an expert projection"),
                               ("down_exps.weight", (4, 8, 16), "checkpoint shape")]:
        with pytest.raises(ValueError, match=match):
            experts.load_stacked(name, torch.zeros(shape))
