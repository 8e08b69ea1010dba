"""`anycore eval perplexity`: perplexity of a model over a text file.

Like llama.cpp's perplexity tool: the tokenized text is cut into non-overlapping windows of
``ctx`` tokens, and in each window only the second half of the tokens is scored (each of them
then sees at least ctx/2 tokens of context). Results are therefore comparable across dtypes,
quantizations and engines that use the same windows. ``LlamaCppScorer`` scores the same
windows with llama.cpp (llama-cpp-python, the ``bench`` extra) for a side-by-side figure.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class PerplexityResult:
    perplexity: float
    tokens_scored: int
    windows: int
    ctx: int
    seconds: float


class Scorer(Protocol):
    """What perplexity() needs: anycore's Engine is one, LlamaCppScorer another."""

    max_model_len: int

    def score(self, token_ids: list[int]) -> torch.Tensor: ...


def tokenize_file(engine, path: str, max_tokens: int | None) -> list[int]:
    """The first ``max_tokens`` token ids of a text file (``engine.tokenizer``; 0/None: all)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    # tokenize a prefix only: ~4 chars per token is generous for English text
    if max_tokens:
        text = text[: max_tokens * 8]
    ids = engine.tokenizer.encode(text)
    return ids[:max_tokens] if max_tokens else ids


def perplexity(engine: Scorer, token_ids: list[int], ctx: int = 512) -> PerplexityResult:
    if ctx < 4 or ctx > engine.max_model_len:
        raise ValueError(f"ctx must be in [4, {engine.max_model_len}]")
    windows = len(token_ids) // ctx
    if windows == 0:
        raise ValueError(f"the text has {len(token_ids)} tokens, fewer than one window of {ctx}")
    t0 = time.perf_counter()
    nll, count = 0.0, 0
    first = ctx // 2
    for w in range(windows):
        window = token_ids[w * ctx : (w + 1) * ctx]
        lp = engine.score(window)  # lp[i] = log p(window[i+1] | window[:i+1])
        scored = lp[first - 1 :]
        nll -= float(scored.double().sum())
        count += scored.numel()
    return PerplexityResult(math.exp(nll / count), count, windows, ctx, time.perf_counter() - t0)


class LlamaCppScorer:
    """llama.cpp scoring a GGUF file on token ids it is given (so both engines see the very same
    windows): ``score`` has Engine.score's contract, log p(token[i+1] | tokens[:i+1])."""

    def __init__(self, gguf_path: str, ctx: int, threads: int | None = None) -> None:
        try:
            import llama_cpp
        except ImportError:
            raise RuntimeError("llama-cpp-python is not installed (pip install -e '.[bench]')") from None
        threads = threads or torch.get_num_threads()
        self.llm = llama_cpp.Llama(model_path=gguf_path, n_ctx=ctx, n_batch=ctx, n_ubatch=ctx, logits_all=True,
                                   n_threads=threads, n_threads_batch=threads, verbose=False)
        self.max_model_len = ctx

    def score(self, token_ids: list[int]) -> torch.Tensor:
        self.llm.reset()
        self.llm.eval(token_ids)
        logits = torch.from_numpy(self.llm.scores[: len(token_ids) - 1]).float()
        return logits.log_softmax(-1).gather(1, torch.tensor(token_ids[1:])[:, None])[:, 0]

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's own tokenization of ``text`` (no BOS), to compare token counts."""
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
