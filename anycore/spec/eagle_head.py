"""One-layer draft heads over the target's hidden states: EAGLE heads, loaded from their
Hugging Face checkpoint layouts, and a model's own multi-token-prediction (MTP) layer.

Each predicts the target's next token from the target's own hidden states, one decoder layer
deep, with a KV pool of its own (the speculator's, anycore/spec/eagle.py):

- ``eagle`` (EAGLE-1/2): ``fc`` Linear(2H -> H, bias optional) over [token embedding, feature];
  one Llama decoder layer ``layers.0`` whose input norm is absent (the layer starts from the
  fc output); logits from the target's LM head over the layer's output, unnormed. A feature is
  the target's final normed hidden state, or for a drafted position the head's own previous
  output: both go through ``fc``.
- ``eagle3`` (EAGLE-3): ``fc`` Linear(3H -> H) over three target residual streams (a low,
  middle and high layer, ``eagle_config.eagle_aux_hidden_state_layer_ids`` or the default
  inputs of layers 2, L/2, L-3); the decoder layer ``midlayer`` attends over
  [input_layernorm(embedding), hidden_norm(hidden)] (q/k/v of input width 2H) with the hidden
  as its residual; its own ``norm`` and ``lm_head`` over a reduced draft vocabulary, mapped
  back with ``d2t`` (target id = draft id + d2t[draft id]). A drafted position's hidden is the
  layer's previous output as is (``fc`` only maps target features).
- ``mtp`` (MiMo's MTP layer, ``model.mtp_layers.0`` of the target checkpoint: spec/mtp.py):
  ``input_proj`` Linear(2H -> H, no bias) over [hidden_layernorm(feature),
  token_layernorm(embedding)], the embedding zeroed at position 0; a full Qwen2 decoder layer
  (input norm, q/k/v bias) over that; ``final_layernorm`` over the layer's output, whose logits
  come from the target's LM head. A feature is the target's final normed hidden state, or for a
  drafted position the head's own previous output (after ``final_layernorm``): one layer used
  recursively for every draft token.

The token embedding is the target's unless the checkpoint carries ``embed_tokens.weight``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from anycore.kernels.ops import KernelOps
from anycore.layers.attention import PagedAttention
from anycore.layers.embedding import VocabEmbedding
from anycore.layers.forward_batch import ForwardBatch
from anycore.layers.linear import Linear
from anycore.layers.norm import RMSNorm
from anycore.layers.rotary import RotaryTable

KINDS = ("eagle", "eagle3", "mtp")
_SHARDS = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
           "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def read_checkpoint(folder: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """config.json and every tensor of an HF folder (*.safetensors, or pytorch_model.bin)."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    files = sorted(folder.glob("*.safetensors"))
    if files:
        from safetensors.torch import load_file

        for f in files:
            tensors.update(load_file(f))
    else:
        for f in sorted(folder.glob("*.bin")):
            tensors.update(torch.load(f, map_location="cpu", weights_only=True))
    if not tensors:
        raise FileNotFoundError(f"{folder}: no *.safetensors or *.bin weights")
    return config, tensors


def aux_layers(config: dict[str, Any], target_layers: int) -> tuple[int, ...]:
    """The target layers whose input stream EAGLE-3 reads (index ``target_layers``: the stream
    after the last layer). Checkpoint ids name layer outputs, so they are shifted by one."""
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    layers = tuple(i + 1 for i in ids) if ids else (2, target_layers // 2, target_layers - 3)
    if len(layers) != 3 or not all(0 <= i <= target_layers for i in layers):
        raise ValueError(f"EAGLE-3 needs three target layers in [0, {target_layers}], got {layers}: set "
                         "eagle_config.eagle_aux_hidden_state_layer_ids in the head's config.json")
    return layers


class EagleHead(nn.Module):
    def __init__(self, kind: str, config: dict[str, Any], target: nn.Module, ops: KernelOps, dtype: torch.dtype,
                 max_positions: int, has_input_norm: bool, fc_bias: bool, own_embedding: bool) -> None:
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"unknown draft head kind {kind!r}")
        tc = target.config
        self.kind = kind
        h = config["hidden_size"]
        if h != tc.hidden_size:
            raise ValueError(f"{kind} head width {h} != the target's {tc.hidden_size}")
        heads = config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads") or heads
        d = config.get("head_dim") or h // heads
        eps = config.get("rms_norm_eps", 1e-6)
        self.num_kv_heads, self.head_dim = kv_heads, d
        self.q_size, self.kv_size = heads * d, kv_heads * d

        def linear(n_in: int, out: int | list[int], bias: bool = False) -> Linear:
            return Linear(n_in, out, bias, dtype, ops)

        width = config["intermediate_size"]
        self.target = (target,)  # (a tuple: the target is not a submodule of the head)
        self.embed_tokens = VocabEmbedding(tc.vocab_size, h, dtype) if own_embedding else None
        feature = 3 * config.get("target_hidden_size", h) if kind == "eagle3" else 2 * h
        self.fc = linear(feature, h, fc_bias) if kind != "mtp" else None
        if kind == "mtp":
            self.input_proj = linear(2 * h, h)
            self.token_layernorm = RMSNorm(h, eps, ops, dtype)
            self.hidden_layernorm = RMSNorm(h, eps, ops, dtype)
            self.final_layernorm = RMSNorm(h, eps, ops, dtype)
        attn_in = 2 * h if kind == "eagle3" else h
        self.qkv_proj = linear(attn_in, [self.q_size, self.kv_size, self.kv_size], config.get("attention_bias", False))
        self.o_proj = linear(self.q_size, h)
        self.gate_up_proj = linear(h, [width, width])
        self.down_proj = linear(width, h)
        self.input_layernorm = RMSNorm(h, eps, ops, dtype) if has_input_norm else None
        self.hidden_norm = RMSNorm(h, eps, ops, dtype) if kind == "eagle3" else None
        self.post_attention_layernorm = RMSNorm(h, eps, ops, dtype)
        self.attn = PagedAttention(heads, kv_heads, d, 0, ops)
        rope = config.get("rope_scaling")
        self.rotary = RotaryTable(d, float(config.get("rope_theta", 10000.0)), rope, max_positions)
        self.ops = ops
        self.d2t: torch.Tensor | None = None
        if kind == "eagle3":
            self.draft_vocab = config.get("draft_vocab_size") or tc.vocab_size
            self.norm = RMSNorm(h, eps, ops, dtype)
            self.lm_head = linear(h, self.draft_vocab)

    @classmethod
    def load(cls, kind: str, folder: str | Path, target: nn.Module, ops: KernelOps, dtype: torch.dtype,
             max_positions: int) -> tuple[EagleHead, dict[str, Any]]:
        config, tensors = read_checkpoint(folder)
        return cls.from_tensors(kind, config, tensors, target, ops, dtype, max_positions), config

    @classmethod
    def from_tensors(cls, kind: str, config: dict[str, Any], tensors: dict[str, torch.Tensor], target: nn.Module,
                     ops: KernelOps, dtype: torch.dtype, max_positions: int) -> EagleHead:
        """A head from its checkpoint's config and tensors (HF names; ``mtp``: the target's
        ``model.mtp_layers.0.*``)."""
        layer = {"eagle3": "midlayer.", "mtp": "mtp_layers.0."}.get(kind, "layers.0.")
        names = {k.removeprefix("model.") for k in tensors}
        if kind == "eagle3" and not any(n.startswith(layer) for n in names):
            layer = "layers.0."  # (some EAGLE-3 exports name the one layer like EAGLE-1)
        input_norm = kind == "mtp" or f"{layer}input_layernorm.weight" in names  # (MTP: a full decoder layer)
        head = cls(kind, config, target, ops, dtype, max_positions, input_norm, "fc.bias" in names,
                   "embed_tokens.weight" in names)
        head._load(tensors, layer)
        return head

    @torch.no_grad()
    def _load(self, tensors: dict[str, torch.Tensor], layer: str) -> None:
        seen: set[str] = set()
        for name, t in tensors.items():
            name = name.removeprefix("model.")
            if name == "t2d":
                continue  # (the inverse of d2t; not needed to draft)
            if name == "d2t":
                self.d2t = t.to(torch.int64)
                continue
            name = name.removeprefix(layer).removeprefix("self_attn.").removeprefix("mlp.")
            module_name, kind = name.rsplit(".", 1)
            shard = 0
            if module_name in _SHARDS:
                module_name, shard = _SHARDS[module_name]
            module = getattr(self, module_name, None)
            if not isinstance(module, nn.Module):
                raise ValueError(f"{self.kind} head checkpoint tensor {name!r} matches nothing in the head")
            if isinstance(module, Linear):
                module.load(kind, t, shard)
            else:
                param = getattr(module, kind)
                if tuple(param.shape) != tuple(t.shape):
                    raise ValueError(f"{name}: checkpoint shape {tuple(t.shape)} != {tuple(param.shape)}")
                param.data.copy_(t)
            seen.add(f"{module_name}.{kind}#{shard}")
        for module_name, module in self.named_children():
            if isinstance(module, Linear):
                want = [f"{module_name}.{k}#{s}" for k in module.param_kinds() for s in range(len(module.out_sizes))]
            elif isinstance(module, (RMSNorm, VocabEmbedding)):
                want = [f"{module_name}.weight#0"]
            else:
                continue
            missing = [w for w in want if w not in seen]
            if missing:
                raise ValueError(f"{self.kind} head checkpoint lacks {missing[:3]}")
        if self.kind == "eagle3" and self.d2t is None and self.draft_vocab != self.target[0].config.vocab_size:
            raise ValueError("EAGLE-3 checkpoint with a reduced draft vocabulary has no d2t map")
        for module in self.modules():
            if isinstance(module, Linear):
                module.method.process_weights_after_loading(module)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        table = self.embed_tokens if self.embed_tokens is not None else self.target[0].embed_tokens
        return table(input_ids)

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, from_target: bool,
                batch: ForwardBatch) -> torch.Tensor:
        """The layer's output for each row: token ``input_ids[i]`` paired with ``features[i]``
        (target features when ``from_target``, else the head's own previous outputs)."""
        emb = self.embed(input_ids)
        if self.kind == "mtp":
            # (position 0's token embedding is zeroed, as MiMo's MTP layer is run in vLLM)
            emb = emb.masked_fill((batch.positions == 0)[:, None], 0.0)
            hidden = self.input_proj(torch.cat((self.hidden_layernorm(features.to(emb.dtype)),
                                                self.token_layernorm(emb)), dim=-1))
            residual = hidden
            x = self.input_layernorm(hidden)
        elif self.kind == "eagle":
            hidden = self.fc(torch.cat((emb, features.to(emb.dtype)), dim=-1))
            residual = hidden
            x = hidden if self.input_layernorm is None else self.input_layernorm(hidden)
        else:
            hidden = self.fc(features.to(emb.dtype)) if from_target else features
            residual = hidden
            x = torch.cat((self.input_layernorm(emb), self.hidden_norm(hidden)), dim=-1)
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        cos, sin = self.rotary.lookup(batch.positions)
        q = self.ops.apply_rotary(q.contiguous(), cos, sin, self.head_dim)
        k = self.ops.apply_rotary(k.contiguous(), cos, sin, self.head_dim)
        attn = self.o_proj(self.attn(q, k, v.contiguous(), batch))
        x, residual = self.post_attention_layernorm(attn, residual)
        out = self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x))) + residual
        return self.final_layernorm(out) if self.kind == "mtp" else out

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Next-token logits of each output row, over the draft vocabulary (``to_target`` maps ids)."""
        if self.kind != "eagle3":
            return self.target[0].compute_logits(out)
        return self.lm_head(self.norm(out)).float()

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids + self.d2t[ids] if self.d2t is not None else ids

    def draft_ids(self, out: torch.Tensor) -> torch.Tensor:
        """The greedy next token (a target id) of each output row."""
        return self.to_target(self.logits(out).argmax(dim=-1))

    def draft_topk(self, out: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` likeliest next tokens (target ids) of each row, with their log-probabilities."""
        lp, ids = self.logits(out).float().log_softmax(dim=-1).topk(k, dim=-1)
        return self.to_target(ids), lp
