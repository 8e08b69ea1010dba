"""Hugging Face transformers in-process for `anycore bench compare`, on the same GGUF (dequantized
to bf16 or fp32 by transformers' GGUF reader), or on an HF folder (`anycore bench moe`): a plain
eager forward per token."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from anycore.bench.peers.base import Runner, random_prompt, require

HF_DTYPES = ("bf16", "fp32")


class TransformersRunner(Runner):
    def __init__(self, name: str, gguf_path: Path, dtype: str, threads: int) -> None:
        import torch

        transformers = require("transformers", "pip install transformers accelerate gguf")
        torch.set_num_threads(threads)
        self.torch = torch
        tdtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        if gguf_path.is_dir():  # an HF folder (`anycore bench moe` writes one)
            self.model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf_path), dtype=tdtype).eval()
        else:
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                str(gguf_path.parent), gguf_file=gguf_path.name, dtype=tdtype).eval()
        import inspect

        # transformers 5.x renamed the KV-cache argument from past_key_values to cache
        self._cache_kw = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        wb = sum(p.numel() * p.element_size() for p in self.model.parameters())
        super().__init__(name, dtype, wb, {"dtype": dtype, "threads": threads})
        self.decode(8, random.Random(-1))  # warm-up

    def decode(self, n: int, rng: random.Random) -> float:
        torch = self.torch
        with torch.inference_mode():
            out = self.model(torch.tensor([random_prompt(rng, 16)]), use_cache=True, logits_to_keep=1)
            cache, tok = self._cache(out), out.logits[:, -1].argmax(-1, keepdim=True)
            t0 = time.perf_counter()
            for _ in range(n):
                out = self.model(tok, use_cache=True, **{self._cache_kw: cache})
                cache, tok = self._cache(out), out.logits[:, -1].argmax(-1, keepdim=True)
            return n / (time.perf_counter() - t0)

    @staticmethod
    def _cache(out: Any) -> Any:
        cache = getattr(out, "cache", None)
        return cache if cache is not None else out.past_key_values

    def prefill(self, n: int, rng: random.Random) -> float:
        torch = self.torch
        ids = torch.tensor([random_prompt(rng, n)])
        with torch.inference_mode():
            t0 = time.perf_counter()
            self.model(ids, use_cache=True, logits_to_keep=1).logits.argmax(-1)
            return n / (time.perf_counter() - t0)

    def batch(self, num: int, input_len: int, output_len: int, rng: random.Random) -> float | None:
        torch = self.torch
        ids = torch.tensor([random_prompt(rng, input_len) for _ in range(num)])
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=output_len, min_new_tokens=output_len, pad_token_id=0)
            dt = time.perf_counter() - t0
        return (out.shape[1] - input_len) * num / dt
