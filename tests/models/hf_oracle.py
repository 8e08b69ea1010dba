"""Greedy generation with transformers, the reference every model test compares against."""

from __future__ import annotations

import torch


@torch.no_grad()
def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int] | None = None) -> list[int]:
    out = model.generate(
        torch.tensor([prompt_ids]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=sorted(eos_ids) if eos_ids else None,
        pad_token_id=0,
    )
    return out[0, len(prompt_ids):].tolist()
