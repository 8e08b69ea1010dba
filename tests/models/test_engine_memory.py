"""What the engine keeps resident after loading: the model, not the file it came from."""

from __future__ import annotations

import gc
import weakref

import anycore.engine.engine as engine_module
from anycore import LLM


def test_engine_releases_the_model_source(monkeypatch):
    """The parsed GGUF (reader, metadata, tokenizer arrays: ~75 MB for SmolLM2) is dropped
    once the weights are in the model."""
    refs = []
    open_source = engine_module.open_model_source

    def spy(model):
        source = open_source(model)
        refs.append(weakref.ref(source))
        return source

    monkeypatch.setattr(engine_module, "open_model_source", spy)
    llm = LLM(dtype="float32", kv_cache_gb=0.05)
    gc.collect()
    assert len(refs) == 1 and refs[0]() is None
    assert llm.engine.hf_config["architectures"]  # what `anycore quantize` still needs
    assert llm.generate("Hi", None)[0].text is not None
