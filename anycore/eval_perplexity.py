"""`anycore eval perplexity`: perplexity of a model over a text file.

Like llama.cpp's perplexity tool: the tokenized text is cut into non-overlapping windows of
``ctx`` tokens, and in each window only the second half of the tokens is scored (each of them
then sees at least ctx/2 tokens of context). Results are therefore comparable across dtypes,
quantizations and engines that use the same windows.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from anycore.engine.engine import Engine


@dataclass
class PerplexityResult:
    perplexity: float
    tokens_scored: int
    windows: int
    ctx: int
    seconds: float


def tokenize_file(engine: Engine, path: str, max_tokens: int | None) -> list[int]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    # tokenize a prefix only: ~4 chars per token is generous for English text
    if max_tokens:
        text = text[: max_tokens * 8]
    ids = engine.tokenizer.encode(text)
    return ids[:max_tokens] if max_tokens else ids


def perplexity(engine: Engine, token_ids: list[int], ctx: int = 512) -> PerplexityResult:
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
