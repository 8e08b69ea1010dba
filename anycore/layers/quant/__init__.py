"""Quantization methods for linear layers, by name (`--quantization NAME`)."""

from __future__ import annotations

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
