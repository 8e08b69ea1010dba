"""Adding a model architecture: one registered class, nothing else.

A toy architecture written here (pre-norm attention with RoPE from anycore.layers, then a plain
GELU MLP with no gate) is registered, loaded from an HF folder written by the test and served by
the engine. It declares no native layout, so the runner's NativeExecutor runs it op by op; its
prompt logprobs and greedy tokens must equal an independent plain-torch forward of the same math.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from anycore import LLM, SamplingParams
from anycore.layers.embedding import LogitsHead, VocabEmbedding
from anycore.layers.linear import Linear
from anycore.layers.norm import RMSNorm
from anycore.layers.rotary import RotaryTable
from anycore.models.llama import Attention
from anycore.models.registry import register
from anycore.models.weight_loading import load_weights

V, H, FF, L, HEADS, D = 256, 64, 96, 2, 4, 16


class GeluMLP(nn.Module):
    def __init__(self, cfg, linear) -> None:
        super().__init__()
        self.up_proj = linear(cfg.hidden_size, cfg.intermediate_size, False)
        self.down_proj = linear(cfg.intermediate_size, cfg.hidden_size, False)

    def forward(self, x):
        return self.down_proj(F.gelu(self.up_proj(x)))


class ToyLayer(nn.Module):
    def __init__(self, cfg, layer_idx, ops, dtype, linear) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx, ops, dtype, linear)
        self.mlp = GeluMLP(cfg, linear)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops, dtype)

    def forward(self, hidden, cos, sin, batch):
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, batch)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


@register("ToyGeluForCausalLM")
class ToyGeluForCausalLM(nn.Module):
    """Llama's attention block (anycore.models.llama.Attention) with a gate-free GELU MLP."""

    def __init__(self, cfg, ops, dtype, max_positions, linear_method=None) -> None:
        super().__init__()

        def linear(in_features, out_sizes, bias):
            return Linear(in_features, out_sizes, bias, dtype, ops, linear_method() if linear_method else None)

        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, dtype)
        self.layers = nn.ModuleList(ToyLayer(cfg, i, ops, dtype, linear) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops, dtype)
        self.lm_head = LogitsHead(cfg.vocab_size, cfg.hidden_size, dtype, None, ops)
        self.rotary = RotaryTable(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, max_positions)

    def forward(self, batch, layers=None):
        cos, sin = self.rotary.lookup(batch.positions)
        hidden = self.embed_tokens(batch.input_ids)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin, batch)
        return self.norm(hidden[batch.logits_indices])

    def compute_logits(self, hidden):
        return self.lm_head(hidden)

    def native_layers(self):
        return None  # no native layout declared: the runner runs it op by op

    def load_weights(self, weights):
        load_weights(self, weights, {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}, tie_word_embeddings=False)


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.2

    w = {"model.embed_tokens.weight": r(V, H), "model.norm.weight": 1 + r(H), "lm_head.weight": r(V, H)}
    for i in range(L):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": 1 + r(H), p + "post_attention_layernorm.weight": 1 + r(H),
              p + "self_attn.q_proj.weight": r(H, H), p + "self_attn.k_proj.weight": r(H // 2, H),
              p + "self_attn.v_proj.weight": r(H // 2, H), p + "self_attn.o_proj.weight": r(H, H),
              p + "mlp.up_proj.weight": r(FF, H), p + "mlp.down_proj.weight": r(H, FF)}
    return w


def _reference_logits(w: dict[str, torch.Tensor], ids: list[int]) -> torch.Tensor:
    """The same math in plain torch, over the whole sequence at once."""
    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight

    def rope(x):  # [T, heads, D], rotate-half convention
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D))
        f = torch.arange(x.shape[0]).float()[:, None] * inv[None]
        cos, sin = torch.cat([f, f], -1).cos()[:, None], torch.cat([f, f], -1).sin()[:, None]
        x1, x2 = x[..., : D // 2], x[..., D // 2 :]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    t = len(ids)
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(L):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T).view(t, HEADS, D)).transpose(0, 1)
        k = rope((h @ w[p + "self_attn.k_proj.weight"].T).view(t, HEADS // 2, D)).transpose(0, 1)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(t, HEADS // 2, D).transpose(0, 1)
        k, v = k.repeat_interleave(2, 0), v.repeat_interleave(2, 0)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(t, H)
        x = x + a @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        x = x + F.gelu(h @ w[p + "mlp.up_proj.weight"].T) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


@pytest.fixture
def toy_folder(tmp_path, tokenizer):
    from safetensors.torch import save_file

    w = _weights()
    save_file(w, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["ToyGeluForCausalLM"], "vocab_size": V, "hidden_size": H, "intermediate_size": FF,
        "num_hidden_layers": L, "num_attention_heads": HEADS, "num_key_value_heads": HEADS // 2,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}))
    tokenizer.save_pretrained(tmp_path)
    return tmp_path, w


def test_a_registered_architecture_serves_and_matches_its_reference(toy_folder):
    folder, w = toy_folder
    llm = LLM(model=str(folder), dtype="float32", kv_cache_gb=0.01)
    assert type(llm.engine.model).__name__ == "ToyGeluForCausalLM"
    assert llm.engine.runner.native.stack(torch.float32) is None  # declared no native layout
    ids = [5, 17, 33, 99, 4, 250, 7, 12]
    ref = _reference_logits(w, ids).log_softmax(-1)
    got = llm.engine.next_token_logprobs(ids)
    torch.testing.assert_close(got, ref, atol=2e-4, rtol=2e-4)
    # greedy decoding through the engine equals the reference's argmax chain
    out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0].outputs[0]
    seq = list(ids)
    for _ in range(6):
        seq.append(int(_reference_logits(w, seq)[-1].argmax()))
    assert out.token_ids == seq[len(ids):]
