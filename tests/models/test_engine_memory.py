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


def test_streamed_weight_bytes_leave_out_gathered_embeddings(tmp_path, tokenizer):
    """The bandwidth limit's divisor: an embedding table the logits head does not multiply by
    (untied, or tied but replaced by an int8 copy) is only gathered from, a row per token."""
    from tests.models.test_tiny_models import write_checkpoint

    def everything(model):
        return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])

    for name, tied in (("llama-untied-llama3-rope", False), ("qwen2-qkv-bias", True)):
        path = tmp_path / name
        write_checkpoint(path, name, tokenizer)
        for kw in ({}, {"quantization": "w8a8_int8", "quantize_lm_head": True}):
            engine = LLM(model=str(path), dtype="float32", kv_cache_gb=0.01, **kw).engine
            table = engine.model.embed_tokens.weight
            gathered_only = not tied or bool(kw)
            assert engine.weight_bytes == everything(engine.model) - gathered_only * table.numel() * 4, (name, kw)
