"""Model sources: where config, tokenizer and weights come from (GGUF file or HF folder)."""

from anycore.loader.source import ModelSource, open_model_source

__all__ = ["ModelSource", "open_model_source"]
