"""Multi-token-prediction (MTP) drafting: the target checkpoint's own next-next-token layer as
a draft head (``--speculative-algorithm mtp``, no separate head folder).

Supported layout: MiMo's (``MiMoForCausalLM``, anycore/models/mimo.py), ``model.mtp_layers.{i}``
with token/hidden norms, ``input_proj``, a Qwen2 decoder layer and ``final_layernorm``, sharing
the target's embedding and LM head. It drafts as an EAGLE head does (anycore/spec/eagle.py:
features of the target's final normed hidden state, the head's own KV pool, chain or tree
drafts), layer 0 used recursively for every draft token (as vLLM runs MiMo's MTP); further MTP
layers, when a checkpoint has them, are not used.

Not supported: the DeepSeek-V3 layout (``model.layers.{num_hidden_layers}.{enorm, hnorm,
eh_proj, shared_head}``), whose decoder layer is MLA attention, which anycore does not implement.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def mtp_checkpoint(target: nn.Module, source: Any, dtype: torch.dtype) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The config and tensors of the target's first MTP layer, as an ``mtp`` head reads them
    (anycore/spec/eagle_head.py). ``source``: the target's opened ModelSource."""
    prefix = getattr(target, "mtp_prefix", None)
    names = getattr(target, "mtp_weight_names", None) or []
    tc = target.config
    if prefix is None or not names:
        declared = int(source.hf_config.get("num_nextn_predict_layers") or 0)
        why = (f"its config declares num_nextn_predict_layers={declared} but no {prefix}* tensors are in it"
               if declared and prefix is not None else "it has no MTP layers")
        raise ValueError(f"speculative_algorithm 'mtp' drafts with the target checkpoint's own multi-token-"
                         f"prediction layers, and {source.path} ({tc.architecture}, {source.format}) has none: "
                         f"{why}. Supported: MiMoForCausalLM checkpoints with model.mtp_layers.* (the "
                         "DeepSeek-V3 MTP layout needs MLA attention, which anycore does not implement); "
                         "use another speculative_algorithm")
    layer = f"{prefix}0."
    tensors = {name: source.tensor(name, dtype) for name in names if name.startswith(layer)}
    if not tensors:
        raise ValueError(f"{source.path}: MTP tensors {names[:2]}... but none of layer 0 ({layer}*)")
    config = dict(hidden_size=tc.hidden_size, num_attention_heads=tc.num_heads, num_key_value_heads=tc.num_kv_heads,
                  head_dim=tc.head_dim, intermediate_size=tc.intermediate_size, rms_norm_eps=tc.rms_norm_eps,
                  rope_theta=tc.rope_theta, rope_scaling=tc.rope_scaling, attention_bias=tc.attention_bias)
    return config, tensors
