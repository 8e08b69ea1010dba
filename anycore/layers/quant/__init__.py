"""Quantization methods for linear layers, by name (`--quantization NAME`)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from anycore.layers.linear import Linear
from anycore.layers.quant.smoothing import collect_input_absmax, smooth
from anycore.layers.quant.w8a8_int8 import W8A8Int8LinearMethod

QUANTIZATION_METHODS = {"w8a8_int8": W8A8Int8LinearMethod}


def linear_method_factory(name: str | None, prequantized: bool = False):
    """A zero-argument factory of LinearMethods for ``name`` (None: dense layers)."""
    if name is None:
        return None
    try:
        cls = QUANTIZATION_METHODS[name]
    except KeyError:
        raise ValueError(f"unknown quantization {name!r}; supported: {sorted(QUANTIZATION_METHODS)}") from None
    return lambda: cls(prequantized=prequantized)


def resolve_quantization(requested: str | None, hf_config: dict) -> tuple[str | None, bool]:
    """(method name, pre-quantized?) from the user's flag and the checkpoint's own config."""
    qc = hf_config.get("quantization_config")
    if not qc:
        if requested is not None and requested not in QUANTIZATION_METHODS:
            raise ValueError(f"unknown quantization {requested!r}; supported: {sorted(QUANTIZATION_METHODS)}")
        return requested, False
    from anycore.layers.quant.compressed_tensors import method_of

    found = method_of(qc)
    if requested is not None and requested != found:
        raise ValueError(f"the checkpoint is pre-quantized as {found}; it cannot be served as {requested}")
    return found, True


def quantize_online(model: nn.Module, make_method: Callable, run_calibration: Callable[[], object],
                    alpha: float = 0.5) -> None:
    """Smooths activation outliers into the weights (when the model declares where), then
    switches every Linear to the quantized method and converts its weights."""
    pairs = model.smooth_pairs() if hasattr(model, "smooth_pairs") else []
    if pairs:
        smooth(pairs, collect_input_absmax([p.linear for p in pairs], run_calibration), alpha)
    for module in model.modules():
        if isinstance(module, Linear):
            module.method = make_method()
            module.method.process_weights_after_loading(module)
