"""Prompt-lookup (n-gram) drafts: the tokens that followed the latest earlier occurrence of the
context's last n tokens, for n from ``n_max`` down to ``n_min``.

Pure numpy over token ids: no model, so the scheduler can propose while it plans the step.
Input-grounded outputs (quoting, editing, summarising with the prompt's words) repeat long
spans of the context, which is where such drafts are accepted.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def propose_ngram(tokens: list[int] | np.ndarray, k: int, n_max: int, n_min: int) -> list[int]:
    """Up to ``k`` draft tokens continuing ``tokens``; [] when no n-gram of the allowed sizes
    recurs. The latest earlier match wins (the freshest context, e.g. the text being edited
    right now); a match whose continuation runs into the end of the context yields fewer."""
    if k <= 0:
        return []
    arr = np.asarray(tokens, dtype=np.int64)
    length = len(arr)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        if n <= 0:
            break
        pattern = arr[length - n:]
        # windows starting at 0 .. length - n - 1: every occurrence except the suffix itself
        windows = sliding_window_view(arr[: length - 1], n)
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        if len(hits) == 0:
            continue
        start = int(hits[-1]) + n  # the token after the latest match
        return arr[start : start + k].tolist()
    return []
