"""Small random-weight checkpoints of each supported architecture, written here, vs transformers."""

from __future__ import annotations

import pytest
import torch

from anycore import LLM, SamplingParams
from tests.models.hf_oracle import hf_greedy

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              bos_token_id=1, eos_token_id=2)


def _configs():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    return {
        "llama-untied-llama3-rope": (LlamaConfig, dict(tie_word_embeddings=False, rope_parameters={
            "rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
        "mistral": (MistralConfig, dict(sliding_window=None, tie_word_embeddings=False)),
        "qwen2-qkv-bias": (Qwen2Config, dict(tie_word_embeddings=True)),
        "qwen3-qk-norm": (Qwen3Config, dict(head_dim=32, tie_word_embeddings=True)),
    }


def write_checkpoint(folder, name, tokenizer):
    from transformers import AutoModelForCausalLM

    cls, extra = _configs()[name]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cls(**COMMON, **extra), dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():  # larger than init so logits are not near-ties
            p.normal_(0, 0.2)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model.eval()


@pytest.mark.parametrize("name", sorted(_configs()))
def test_random_checkpoint_matches_transformers(tmp_path, tokenizer, name):
    hf = write_checkpoint(tmp_path, name, tokenizer)
    llm = LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01)
    prompts = [[5, 17, 33, 99, 4, 250, 7], [9, 9, 9], list(range(10, 60))]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = llm.generate(prompts, params)
    for p, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(hf, p, 16)
    # and with prefill chunked to 4 tokens per step
    llm.engine.scheduler.max_num_batched_tokens = 4
    outs = llm.generate(prompts, params)
    for p, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(hf, p, 16)
