"""Tokenizers: HF folders load directly; GGUF vocabularies are converted once and cached.

Converting a GGUF vocabulary (transformers' converter) takes seconds, so the converted fast
tokenizer is saved under ``$ANYCORE_CACHE_DIR`` (default ``~/.cache/anycore``) keyed by the file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    return Path(os.environ.get("ANYCORE_CACHE_DIR", Path.home() / ".cache" / "anycore"))


def load_hf_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def load_gguf_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = cache_dir() / "tokenizers" / key
    if (cached / "tokenizer_config.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(str(cached), local_files_only=True)
        except Exception:  # a stale or partial cache entry: rebuild it below
            pass
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    try:
        tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
        tok.save_pretrained(str(tmp))
        if cached.exists():
            shutil.rmtree(cached)
        tmp.replace(cached)
    except OSError:
        pass  # caching is an optimisation only
    return tok
