"""`anycore quantize`: write a model's W8A8 INT8 weights as a compressed-tensors checkpoint.

The result is an HF folder (config.json with ``quantization_config``, model.safetensors,
tokenizer files) that anycore, vLLM and SGLang load as pre-quantized, so a model is
quantized once and served many times.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from anycore.engine.engine import Engine
from anycore.layers.embedding import LogitsHead
from anycore.layers.linear import Linear
from anycore.layers.moe import Router, StackedExperts
from anycore.layers.quant.compressed_tensors import quantization_config


def export_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Checkpoint-named tensors: merged projections split back into their HF names."""
    merged = getattr(model, "merged_shards", {})
    mixtral = getattr(getattr(model, "config", None), "architecture", "") == "MixtralForCausalLM"
    out: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        prefix = f"model.{name}" if name and not name.startswith("lm_head") else name
        if isinstance(module, Linear):
            parent, _, leaf = prefix.rpartition(".")
            names = [f"{parent}.{n}" for n in merged.get(leaf, [leaf])]
            quantized = hasattr(module, "qweight_packed")
            weight = (module.int8_kernel.unpack(module.qweight_packed, module.out_features, module.in_features)
                      if quantized else module.weight)
            start = 0
            for shard_name, size in zip(names, module.out_sizes):
                out[f"{shard_name}.weight"] = weight[start : start + size].contiguous()
                if quantized:
                    out[f"{shard_name}.weight_scale"] = module.w_scale[start : start + size].reshape(-1, 1).clone()
                if module.bias is not None:
                    out[f"{shard_name}.bias"] = module.bias[start : start + size].clone()
                start += size
        elif isinstance(module, StackedExperts):
            out |= _export_experts(module, prefix, mixtral)
        elif isinstance(module, LogitsHead):
            if module.tied_to is None:
                out["lm_head.weight"] = module.weight.detach().clone()
        elif name and not isinstance(module, (torch.nn.ModuleList,)):
            for pname, p in module.named_parameters(recurse=False):
                out[f"{_sparse_block(prefix, module, mixtral)}.{pname}"] = p.detach().clone()
    return out


def _sparse_block(prefix: str, module: torch.nn.Module, mixtral: bool) -> str:
    """Mixtral checkpoints name the sparse MLP ``block_sparse_moe`` (its router too)."""
    return prefix.replace(".mlp.gate", ".block_sparse_moe.gate") if mixtral and isinstance(module, Router) else prefix


def _export_experts(module: StackedExperts, prefix: str, mixtral: bool) -> dict[str, torch.Tensor]:
    """Int8 experts as compressed-tensors writes them: per expert and projection an int8
    ``weight [N, K]`` and a ``weight_scale [N, 1]`` (Mixtral: ``block_sparse_moe``, w1/w3/w2)."""
    q13, s13, q2, s2 = module.int8_experts()
    i = module.intermediate_size
    if mixtral:
        prefix = prefix.replace(".mlp.experts", ".block_sparse_moe.experts")
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    out = {}
    for e in range(module.num_experts):
        for name, q, s in ((names[0], q13[e, :i], s13[e, :i]), (names[1], q13[e, i:], s13[e, i:]),
                           (names[2], q2[e], s2[e])):
            out[f"{prefix}.{e}.{name}.weight"] = q.contiguous()
            out[f"{prefix}.{e}.{name}.weight_scale"] = s.reshape(-1, 1).clone()
    return out


def save_quantized(engine: Engine, out_dir: str | Path) -> Path:
    if engine.quantization != "w8a8_int8":
        raise ValueError("save_quantized needs an engine loaded with quantization='w8a8_int8'")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = export_state_dict(engine.model)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = dict(engine.hf_config)
    config["torch_dtype"] = str(engine.dtype).removeprefix("torch.")
    # (MoE routers, and Qwen2-MoE's shared-expert gate, stay float: Linear-shaped but not quantized)
    routers = ["re:.*mlp.gate$", "re:.*block_sparse_moe.gate$", "re:.*shared_expert_gate$"]
    config["quantization_config"] = quantization_config(
        ignore=["lm_head"] + (routers if engine.model_config.moe is not None else []))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    engine.tokenizer.save_pretrained(str(out))
    return out
