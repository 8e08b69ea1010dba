"""Tokenizers: HF folders load directly; GGUF vocabularies are converted once and cached.

Converting a GGUF vocabulary (transformers' converter) takes seconds, so the converted fast
tokenizer is saved under ``$ANYCORE_CACHE_DIR`` (default ``~/.cache/anycore``) keyed by the file.
A folder with a ``tokenizer.json`` (every cached conversion) loads as a ``TextTokenizer``,
without transformers (see loader/text_tokenizer.py); others through transformers.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from anycore.loader.text_tokenizer import TextTokenizer


def cache_dir() -> Path:
    return Path(os.environ.get("ANYCORE_CACHE_DIR", Path.home() / ".cache" / "anycore"))


def load_hf_tokenizer(folder: Path) -> Any:
    if (folder / "tokenizer.json").is_file():
        return TextTokenizer(folder)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def load_gguf_tokenizer(path: Path) -> Any:
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = cache_dir() / "tokenizers" / key
    if (cached / "tokenizer_config.json").is_file():
        try:
            return TextTokenizer(cached)
        except Exception:  # a stale or partial cache entry: rebuild it below
            pass
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    except ValueError as e:
        if "not supported" not in str(e):
            raise
        # an architecture transformers' GGUF model reader lacks (olmoe): AutoTokenizer resolves
        # the tokenizer class through it, the fast tokenizer reads the vocabulary directly
        tok = PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    try:
        tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
        tok.save_pretrained(str(tmp))
        if cached.exists():
            shutil.rmtree(cached)
        tmp.replace(cached)
        return TextTokenizer(cached)  # the same class as every later load
    except OSError:
        return tok  # caching is an optimisation only
