"""HF architecture name -> model class."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from anycore.config import ModelConfig
from anycore.kernels.ops import KernelOps

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}


def register(*architectures: str) -> Callable:
    def wrap(cls):
        for arch in architectures:
            _REGISTRY[arch] = cls
        return cls

    return wrap


def supported_architectures() -> list[str]:
    _import_models()
    return sorted(_REGISTRY)


def _import_models() -> None:
    from anycore.models import llama  # noqa: F401  (registers on import)


def build_model(
    config: ModelConfig,
    ops: KernelOps,
    dtype: torch.dtype,
    weights: Iterable[tuple[str, torch.Tensor]],
    max_positions: int,
) -> nn.Module:
    _import_models()
    cls = _REGISTRY.get(config.architecture)
    if cls is None:
        raise ValueError(
            f"unsupported architecture {config.architecture!r}; supported: {', '.join(supported_architectures())}"
        )
    model = cls(config, ops, dtype, max_positions)
    model.load_weights(weights)
    model.eval()
    return model
