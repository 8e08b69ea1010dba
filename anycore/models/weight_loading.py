"""Checkpoint tensors into a model's modules: merged projections, shape checks, completeness.

Shared by every architecture: a model names its merged projections (``merged_shards``: our
merged ``Linear`` -> the checkpoint projections stacked in it, in shard order), a module that
stacks many checkpoint tensors (MoE experts) takes every tensor below its path through its
``load_stacked(rest, tensor)`` and lists what it still lacks in ``missing_tensors()``, and
everything else is matched by module path.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from anycore.layers.embedding import LogitsHead, VocabEmbedding
from anycore.layers.linear import Linear
from anycore.layers.moe import Router
from anycore.layers.norm import RMSNorm


def load_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], merged_shards: dict[str, list[str]],
                 tie_word_embeddings: bool) -> None:
    """Copies every checkpoint tensor into ``model``; raises ValueError naming the first
    tensor that matches nothing or has the wrong shape, or the tensors the checkpoint lacks.
    Then lets each Linear's method process its weights (e.g. repack for a quantized kernel)."""
    shard_of = {proj: (merged, i) for merged, projs in merged_shards.items() for i, proj in enumerate(projs)}
    stacked = {path: m for path, m in model.named_modules() if hasattr(m, "load_stacked")}
    loaded: set[str] = set()
    for name, tensor in weights:
        if "rotary_emb.inv_freq" in name or (name == "lm_head.weight" and tie_word_embeddings):
            continue
        owner = _stacked_owner(stacked, name.removeprefix("model."))
        if owner is not None:
            path, module = owner
            module.load_stacked(name.removeprefix("model.")[len(path) + 1 :], tensor)
            continue
        module_path, kind = name.removeprefix("model.").rsplit(".", 1)
        parent, _, leaf = module_path.rpartition(".")
        if leaf in shard_of:
            merged, shard = shard_of[leaf]
            model.get_submodule(f"{parent}.{merged}").load(kind, tensor, shard)
            loaded.add(f"{parent}.{merged}.{kind}#{shard}")
            continue
        try:
            module = model.get_submodule(module_path)
        except AttributeError:
            raise ValueError(f"checkpoint tensor {name!r} matches no parameter of {type(model).__name__}") from None
        if isinstance(module, Linear):
            module.load(kind, tensor)
        else:
            param = getattr(module, kind)
            if tuple(param.shape) != tuple(tensor.shape):
                raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(param.shape)}")
            param.data.copy_(tensor)
        loaded.add(module_path + "." + kind)
    _check_complete(model, loaded)
    for module in model.modules():
        if isinstance(module, Linear):
            module.method.process_weights_after_loading(module)


def _stacked_owner(stacked: dict[str, nn.Module], name: str) -> tuple[str, nn.Module] | None:
    """The stacking module whose path prefixes ``name``, with that path."""
    if not stacked:
        return None
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        path = ".".join(parts[:i])
        if path in stacked:
            return path, stacked[path]
    return None


def _check_complete(model: nn.Module, loaded: set[str]) -> None:
    missing = []
    for name, module in model.named_modules():
        if hasattr(module, "missing_tensors"):
            missing += [f"{name}.{t}" for t in module.missing_tensors()]
        elif isinstance(module, Linear):
            shards = range(len(module.out_sizes))
            for kind in module.param_kinds():
                keys = [f"{name}.{kind}#{s}" for s in shards] if len(module.out_sizes) > 1 else [f"{name}.{kind}"]
                missing += [k for k in keys if k not in loaded]
        elif isinstance(module, (RMSNorm, VocabEmbedding, Router)) or (isinstance(module, LogitsHead) and module.tied_to is None):
            if f"{name}.weight" not in loaded:
                missing.append(f"{name}.weight")
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:4]}")
