"""Shared fixtures: the default model (fp32) and its transformers oracle, loaded once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def default_model_path():
    from anycore.loader.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def llm_fp32():
    from anycore import LLM

    return LLM(dtype="float32", kv_cache_gb=0.25)


@pytest.fixture(scope="session")
def hf_model(default_model_path):
    """transformers reading the same GGUF (dequantized to fp32): the correctness oracle."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(default_model_path.parent), gguf_file=default_model_path.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="session")
def tokenizer(default_model_path):
    from anycore.loader.tokenizer import load_gguf_tokenizer

    return load_gguf_tokenizer(default_model_path)
