"""GGUF files: config and tokenizer from metadata, weights dequantized on demand, or (for
``--quantization gguf``) projection weights kept in their file blocks.

llama.cpp's converter permutes the rows of Q and K of Llama-architecture models into the
interleaved-pair RoPE layout; we undo that so every model runs the HF rotate-half RoPE.

Gemma 3: llama.cpp's converter stores every RMSNorm weight with the 1 of Gemma's ``1 + weight``
already added (its norm is a plain multiply); we subtract it back, as transformers' GGUF loader
does, so the model sees HF's zero-centred weights. Metadata llama.cpp does not write (it
hard-codes them for gemma3) take llama.cpp's values: every 6th layer global, local RoPE base
10000, attention scale from head_dim (hidden / heads for the 62-layer 27B).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from anycore.config import ModelConfig
from anycore.loader.source import ModelSource
from anycore.loader.tokenizer import load_gguf_tokenizer

# GGUF general.architecture -> (HF architecture, whether Q/K rows were permuted by the converter)
_ARCHS = {
    "llama": ("LlamaForCausalLM", True),
    "mistral": ("MistralForCausalLM", True),
    "qwen2": ("Qwen2ForCausalLM", False),
    "qwen3": ("Qwen3ForCausalLM", False),
    "qwen2moe": ("Qwen2MoeForCausalLM", False),
    "qwen3moe": ("Qwen3MoeForCausalLM", False),
    "olmoe": ("OlmoeForCausalLM", False),  # (NeoX rotary in llama.cpp: rows not permuted)
    # Mixtral is written as "llama" with experts (see gguf_hf_config)
    "gemma3": ("Gemma3ForCausalLM", False),
}
# whether llama.cpp renormalises the top-k routing weights, when the file has no
# {arch}.expert_weights_norm: what its graph for each architecture does
_NORM_TOPK = {"llama": True, "qwen3moe": True, "qwen2moe": False, "olmoe": False}
# GGUF architectures that store Gemma's zero-centred norm weights with 1 added
_NORMS_PLUS_ONE = {"gemma3"}

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    # MoE: the router, the experts stacked [experts, out, in] (StackedExperts.load_stacked), and
    # Qwen2-MoE's shared expert with its gate
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_exps",
    "ffn_up_exps": "mlp.experts.up_exps",
    "ffn_down_exps": "mlp.experts.down_exps",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
}
# per architecture, the names that differ from _LAYER_NAMES (Gemma 3's four norms per layer)
_ARCH_LAYER_NAMES = {
    "gemma3": {
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    m = _BLOCK.match(gguf_name)
    if m:
        layer, part, kind = m.groups()
        mapped = _ARCH_LAYER_NAMES.get(arch, {}).get(part) or _LAYER_NAMES.get(part)
        return f"model.layers.{layer}.{mapped}.{kind}" if mapped else None
    base, _, kind = gguf_name.rpartition(".")
    mapped = _GLOBAL_NAMES.get(base)
    return f"{mapped}.{kind}" if mapped else None


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's permute(): interleaved-pair rows back to rotate-half rows."""
    shape = w.shape
    return w.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def gguf_hf_config(reader: Any) -> dict[str, Any]:
    """An HF-style config dict from GGUF metadata."""
    arch = _field(reader, "general.architecture")
    if arch not in _ARCHS:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: {sorted(_ARCHS)}")

    def g(key: str, default: Any = None) -> Any:
        return _field(reader, f"{arch}.{key}", default)

    n_head = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(g("vocab_size", len(tokens.data) if tokens is not None else 0))
    names = {t.name for t in reader.tensors}
    cfg: dict[str, Any] = {
        "architectures": [_ARCHS[arch][0]],
        "model_type": arch,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(g("attention.head_count_kv", n_head)),
        "head_dim": int(g("attention.key_length", hidden // n_head)),
        "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(g("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
    }
    experts = int(g("expert_count", 0) or 0)
    if experts:
        if arch == "llama":
            cfg["architectures"] = ["MixtralForCausalLM"]
        cfg |= {
            "num_experts": experts,
            "num_local_experts": experts,
            "num_experts_per_tok": int(g("expert_used_count")),
            "moe_intermediate_size": int(g("expert_feed_forward_length", cfg["intermediate_size"])),
            "shared_expert_intermediate_size": int(g("expert_shared_feed_forward_length", 0) or 0),
            "norm_topk_prob": bool(g("expert_weights_norm", _NORM_TOPK.get(arch, False))),
        }
    if g("attention.clamp_kqv") is not None:  # OLMoE's clip_qkv
        cfg["clip_qkv"] = float(g("attention.clamp_kqv"))
    scaling_type = g("rope.scaling.type")
    if scaling_type and scaling_type != "none":
        cfg["rope_scaling"] = {
            "rope_type": scaling_type,
            "factor": float(g("rope.scaling.factor", 1.0)),
            "original_max_position_embeddings": int(g("rope.scaling.original_context_length", 0)) or None,
        }
    if arch == "gemma3":
        cfg.update(_gemma3_config(reader, g, cfg))
    return cfg


def _gemma3_config(reader: Any, g: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """Gemma3TextConfig fields from gemma3.* metadata (llama.cpp's defaults where it writes none)."""
    layers = cfg["num_hidden_layers"]
    pattern = g("attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # per layer: True = sliding
        types = ["sliding_attention" if p else "full_attention" for p in pattern]
    else:
        types = ["sliding_attention" if (i + 1) % int(pattern) else "full_attention" for i in range(layers)]
    scalar = cfg["hidden_size"] // cfg["num_attention_heads"] if layers == 62 else cfg["head_dim"]
    out: dict[str, Any] = {
        "model_type": "gemma3_text",
        "sliding_window": int(g("attention.sliding_window")),
        "layer_types": types,
        "rope_local_base_freq": float(g("rope.freq_base_swa", 10000.0)),
        "query_pre_attn_scalar": scalar,
        "final_logit_softcapping": g("final_logit_softcapping"),
        "attn_logit_softcapping": g("attn_logit_softcapping"),  # (refused when set, see config.py)
        "hidden_activation": "gelu_pytorch_tanh",
    }
    # chat turns end with <end_of_turn>: a stop token besides <eos>, as in Gemma's generation config
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    eot = _field(reader, "tokenizer.ggml.eot_token_id")
    if eot is None and tokens is not None:
        eot = next((i for i, t in enumerate(tokens.contents()) if t == "<end_of_turn>"), None)
    if eot is not None and cfg.get("eos_token_id") is not None and eot != cfg["eos_token_id"]:
        out["eos_token_id"] = [cfg["eos_token_id"], int(eot)]
    return out


def open_gguf(path: Path) -> ModelSource:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    hf = gguf_hf_config(reader)
    config = ModelConfig.from_hf(hf)
    arch = _field(reader, "general.architecture")
    permuted = _ARCHS[arch][1]
    norms_plus_one = arch in _NORMS_PLUS_ONE
    raw = {}
    for t in reader.tensors:
        name = hf_name(t.name, arch)
        if name is not None:
            raw[name] = t

    def load(name: str, dtype: torch.dtype) -> torch.Tensor:
        t = raw[name]
        # GGUF lists dims fastest-first; dequantize() returns the row-major (PyTorch) shape
        arr = dequantize(t.data, t.tensor_type)
        if name.endswith("mlp.shared_expert_gate.weight"):
            arr = arr.reshape(1, -1)  # stored as a vector [hidden]
        elif permuted and name.endswith("self_attn.q_proj.weight"):
            arr = _unpermute(arr, config.num_heads)
        elif permuted and name.endswith("self_attn.k_proj.weight"):
            arr = _unpermute(arr, config.num_kv_heads)
        elif norms_plus_one and name.endswith("norm.weight"):
            arr = arr - np.float32(1.0)  # (in fp32, as transformers' GGUF loader does)
        return torch.from_numpy(np.array(arr, dtype=np.float32, copy=True)).to(dtype)

    def matrix_blocks(name: str):
        """A 2-D tensor in a block type gguf_linear runs, as its rows of blocks (Q/K rows
        un-permuted like the dequantized weight's), else None."""
        from anycore.kernels.gguf import FORMATS
        from anycore.layers.quant.gguf_blocks import GGUFBlocks

        t = raw.get(name)
        if t is None or int(t.tensor_type) not in FORMATS or len(t.shape) != 2:
            return None
        arr = np.asarray(t.data)  # uint8 [rows, row bytes]
        if permuted and name.endswith("self_attn.q_proj.weight"):
            arr = _unpermute(arr, config.num_heads)
        elif permuted and name.endswith("self_attn.k_proj.weight"):
            arr = _unpermute(arr, config.num_kv_heads)
        return GGUFBlocks(int(t.tensor_type), torch.from_numpy(np.array(arr, dtype=np.uint8, copy=True)))

    def blocks(name: str):
        """A projection weight as its blocks (matrix_blocks), else None."""
        return matrix_blocks(name) if name.endswith("_proj.weight") else None

    from anycore.kernels.gguf import FORMATS

    has_blocks = any(n.endswith("_proj.weight") and int(t.tensor_type) in FORMATS and len(t.shape) == 2
                     for n, t in raw.items())
    tokenizer = load_gguf_tokenizer(path)
    return ModelSource(
        path=path,
        format="gguf",
        hf_config=hf,
        config=config,
        tokenizer=tokenizer,
        weight_names=list(raw),
        _weights=load,
        _blocks=blocks,
        has_blocks=has_blocks,
        _matrix_blocks=matrix_blocks,
    )
