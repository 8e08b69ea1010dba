"""A model source: normalised config, tokenizer and an iterator over HF-named weights."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from anycore.config import ModelConfig
from anycore.loader.default_model import default_model_path


@dataclass
class ModelSource:
    """What a loader yields. Weights are produced lazily (one tensor at a time) to bound peak memory."""

    path: Path
    format: str  # "gguf" | "hf"
    hf_config: dict[str, Any]
    config: ModelConfig
    tokenizer: Any  # a transformers tokenizer (fast)
    weight_names: list[str]
    _weights: Any = field(repr=False, default=None)  # callable(name, dtype) -> tensor
    # GGUF: callable(name) -> GGUFBlocks (layers/quant/gguf_blocks.py) for a projection weight in
    # a block type the kernels run, else None; None for other formats
    _blocks: Any = field(repr=False, default=None)
    # GGUF: the file has projection weights in a block type the kernels run (then the default
    # quantization serves them as blocks, layers/quant/__init__.py resolve_quantization)
    has_blocks: bool = False
    # GGUF: callable(name) -> GGUFBlocks of any 2-D tensor in a block type the kernels run (also
    # the embedding table and the logits head), else None
    _matrix_blocks: Any = field(repr=False, default=None)

    def weights(self, dtype: torch.dtype, native_blocks: bool = False) -> Iterator[tuple[str, Any]]:
        """(name, tensor) pairs; ``native_blocks``: projection weights the GGUF kernels run come
        as their file blocks (GGUFBlocks) instead of dequantized tensors."""
        for name in self.weight_names:
            blocks = self._blocks(name) if native_blocks and self._blocks is not None else None
            yield name, blocks if blocks is not None else self._weights(name, dtype)

    def tensor(self, name: str, dtype: torch.dtype) -> Any:
        """One tensor by name (as ``weights`` yields it without native blocks)."""
        return self._weights(name, dtype)

    def matrix_blocks(self, name: str) -> Any:
        """Tensor ``name`` as its file blocks (GGUFBlocks), or None (not a GGUF file, no such
        tensor, or a block type without a kernel)."""
        return self._matrix_blocks(name) if self._matrix_blocks is not None else None


def open_model_source(model: str | Path | None) -> ModelSource:
    """Opens a GGUF file or an HF folder; ``None`` means the default model."""
    path = Path(model) if model is not None else default_model_path()
    if not path.exists():
        raise FileNotFoundError(f"model path does not exist: {path}")
    if path.is_file() and path.suffix == ".gguf":
        from anycore.loader.gguf_loader import open_gguf

        return open_gguf(path)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if (path / "config.json").is_file():
            from anycore.loader.hf_loader import open_hf_folder

            return open_hf_folder(path)
        if len(ggufs) == 1:
            from anycore.loader.gguf_loader import open_gguf

            return open_gguf(ggufs[0])
        raise ValueError(f"{path} holds neither config.json nor exactly one .gguf file")
    raise ValueError(f"unrecognised model file {path}: expected a .gguf file or an HF model folder")
