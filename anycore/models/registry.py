"""HF architecture name -> model class.

Adding an architecture is one file: a module in this package whose class carries
``@register("XForCausalLM")`` (every module here is imported on first lookup), or a class
registered from anywhere before the engine starts. It declares its structure; the runner's
NativeExecutor runs it op by op unless it declares ``native_layers()`` the native stack can run.
"""

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


def op_by_op_architectures() -> dict[str, str]:
    """Architectures whose class says it always runs op by op (``op_by_op_reason``) -> why."""
    _import_models()
    return {arch: cls.op_by_op_reason for arch, cls in sorted(_REGISTRY.items())
            if getattr(cls, "op_by_op_reason", None)}


def check_supported(architecture: str) -> None:
    """Raises a ValueError naming the architecture when no model class implements it."""
    _import_models()
    if architecture not in _REGISTRY:
        raise ValueError(
            f"unsupported architecture {architecture!r}; supported: {', '.join(supported_architectures())}"
        )


def _import_models() -> None:
    import importlib
    import pkgutil

    import anycore.models as package

    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")  # (registers on import)


def build_model(
    config: ModelConfig,
    ops: KernelOps,
    dtype: torch.dtype,
    weights: Iterable[tuple[str, torch.Tensor]],
    max_positions: int,
    linear_method: Callable | None = None,
) -> nn.Module:
    check_supported(config.architecture)
    model = _REGISTRY[config.architecture](config, ops, dtype, max_positions, linear_method)
    model.load_weights(weights)
    model.eval()
    return model
