"""GGUF files: config and tokenizer from metadata, weights dequantized on demand, or (for
``--quantization gguf``) projection weights kept in their file blocks.

llama.cpp's converter permutes the rows of Q and K of Llama-architecture models into the
interleaved-pair RoPE layout; we undo that so every model runs the HF rotate-half RoPE.
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
}

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
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


def hf_name(gguf_name: str) -> str | None:
    m = _BLOCK.match(gguf_name)
    if m:
        layer, part, kind = m.groups()
        mapped = _LAYER_NAMES.get(part)
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
    scaling_type = g("rope.scaling.type")
    if scaling_type and scaling_type != "none":
        cfg["rope_scaling"] = {
            "rope_type": scaling_type,
            "factor": float(g("rope.scaling.factor", 1.0)),
            "original_max_position_embeddings": int(g("rope.scaling.original_context_length", 0)) or None,
        }
    return cfg


def open_gguf(path: Path) -> ModelSource:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    hf = gguf_hf_config(reader)
    config = ModelConfig.from_hf(hf)
    permuted = _ARCHS[_field(reader, "general.architecture")][1]
    raw = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is not None:
            raw[name] = t

    def load(name: str, dtype: torch.dtype) -> torch.Tensor:
        t = raw[name]
        # GGUF lists dims fastest-first; dequantize() returns the row-major (PyTorch) shape
        arr = dequantize(t.data, t.tensor_type)
        if permuted and name.endswith("self_attn.q_proj.weight"):
            arr = _unpermute(arr, config.num_heads)
        elif permuted and name.endswith("self_attn.k_proj.weight"):
            arr = _unpermute(arr, config.num_kv_heads)
        return torch.from_numpy(np.array(arr, dtype=np.float32, copy=True)).to(dtype)

    def blocks(name: str):
        """A projection weight in a block type gguf_linear runs, as its rows of blocks
        (Q/K rows un-permuted like the dequantized weight's), else None."""
        from anycore.kernels.gguf import FORMATS
        from anycore.layers.quant.gguf_blocks import GGUFBlocks

        t = raw[name]
        qtype = int(t.tensor_type)
        if not name.endswith("_proj.weight") or qtype not in FORMATS or len(t.shape) != 2:
            return None
        arr = np.asarray(t.data)  # uint8 [rows, row bytes]
        if permuted and name.endswith("self_attn.q_proj.weight"):
            arr = _unpermute(arr, config.num_heads)
        elif permuted and name.endswith("self_attn.k_proj.weight"):
            arr = _unpermute(arr, config.num_kv_heads)
        return GGUFBlocks(qtype, torch.from_numpy(np.array(arr, dtype=np.uint8, copy=True)))

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
    )
