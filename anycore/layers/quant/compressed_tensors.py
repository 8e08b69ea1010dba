"""The compressed-tensors W8A8 INT8 checkpoint format that vLLM and SGLang read.

On disk: each quantized linear has an int8 ``weight [N, K]`` and a ``weight_scale [N, 1]``
(symmetric, per output channel); activations are quantized dynamically per token, so there is
no ``input_scale``. ``config.json`` carries a ``quantization_config`` saying exactly that.
"""

from __future__ import annotations

from typing import Any

W8A8_INT8 = "w8a8_int8"


def quantization_config(ignore: list[str]) -> dict[str, Any]:
    """The config.json block for a W8A8 INT8 checkpoint (dynamic per-token activations)."""
    return {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel",
                            "dynamic": False, "group_size": None},
                "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                                      "dynamic": True, "group_size": None},
                "output_activations": None,
            }
        },
        "ignore": ignore,
    }


def method_of(qc: dict[str, Any]) -> str:
    """The anycore method for a checkpoint's quantization_config; ValueError if unsupported."""
    if qc.get("quant_method") != "compressed-tensors":
        raise ValueError(f"unsupported pre-quantized checkpoint (quant_method={qc.get('quant_method')!r})")
    groups = list((qc.get("config_groups") or {}).values())
    for g in groups:
        w, a = g.get("weights") or {}, g.get("input_activations") or {}
        if (w.get("num_bits") == 8 and w.get("type") == "int" and w.get("symmetric") and w.get("strategy") == "channel"
                and a.get("num_bits") == 8 and a.get("type") == "int" and a.get("symmetric") and a.get("dynamic")
                and a.get("strategy") == "token"):
            continue
        raise ValueError(
            "unsupported compressed-tensors scheme: only W8A8 INT8 (int8 symmetric per-channel weights, "
            f"dynamic symmetric per-token int8 activations) is implemented; got {g}"
        )
    if not groups:
        raise ValueError("compressed-tensors config has no config_groups")
    return W8A8_INT8
