"""Hugging Face model folders: config.json + (sharded) *.safetensors, memory-mapped."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from anycore.config import ModelConfig
from anycore.loader.source import ModelSource
from anycore.loader.tokenizer import load_hf_tokenizer
from anycore.models.registry import check_supported


def open_hf_folder(folder: Path) -> ModelSource:
    from safetensors import safe_open

    hf = json.loads((folder / "config.json").read_text())
    config = ModelConfig.from_hf(hf)
    check_supported(config.architecture)  # before touching weights or tokenizer
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} has config.json but no *.safetensors weights")
    handles = [safe_open(str(f), framework="pt") for f in files]  # mmap: nothing read yet
    where = {name: h for h in handles for name in h.keys()}

    def load(name: str, dtype: torch.dtype) -> torch.Tensor:
        # as stored: the copy into the parameter converts floats to the run dtype, while int8
        # weights and fp32 scales of pre-quantized checkpoints must arrive untouched
        return where[name].get_tensor(name)

    return ModelSource(
        path=folder,
        format="hf",
        hf_config=hf,
        config=config,
        tokenizer=load_hf_tokenizer(folder),
        weight_names=list(where),
        _weights=load,
    )
