"""Lossless verification of a draft against the target model's distributions.

The target scored the request's last token followed by the k draft tokens in one forward pass,
so row i of its (processed) logits is the distribution of the token after draft i - 1
(row 0: after the last accepted token). Both rules below emit between 1 and k + 1 tokens.

- greedy: accept the longest prefix where the target's argmax equals the draft, then the
  target's argmax at the first mismatch (or after the whole draft: the bonus token). The
  output is exactly what one-token greedy steps would give.
- sampling (speculative rejection sampling): a draft token x drawn from a proposal q is kept
  with probability min(1, p(x) / q(x)); on rejection the token is drawn from the normalised
  residual max(0, p - q). The emitted tokens are then distributed exactly as sampling from
  p step by step. A prompt-lookup draft is deterministic, a point mass q = 1 at x, so the rule
  reduces to: keep x with probability p(x), else draw from p with x removed (renormalised).
"""

from __future__ import annotations

import torch


def verify_greedy(target_argmax: list[int], draft: list[int]) -> list[int]:
    """``target_argmax``: k + 1 argmax tokens (one per scored row); ``draft``: k tokens."""
    out = []
    for i, d in enumerate(draft):
        t = target_argmax[i]
        out.append(t)
        if t != d:
            return out
    out.append(target_argmax[len(draft)])
    return out


def verify_sampled(probs: torch.Tensor, draft: list[int], generator: torch.Generator | None,
                   draft_probs: torch.Tensor | None = None) -> list[int]:
    """``probs``: ``[k + 1, V]`` target probabilities (after temperature and filters);
    ``draft_probs``: ``[k, V]`` the proposal's, or None for a deterministic (point-mass) draft.
    Random numbers come from ``generator`` (a seeded request's own) in a fixed order, so a
    seeded request given the same drafts gives the same tokens."""
    out: list[int] = []
    for i, d in enumerate(draft):
        p = probs[i]
        q_d = 1.0 if draft_probs is None else float(draft_probs[i, d])
        u = float(torch.rand((), generator=generator))
        if q_d > 0 and u * q_d < float(p[d]):  # (u < p(d) / q(d) without dividing)
            out.append(d)
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[d] = 0.0
        else:
            residual = (p - draft_probs[i]).clamp_(min=0.0)
        out.append(draw_weighted(residual, generator))
        return out
    out.append(draw_weighted(probs[len(draft)], generator))
    return out


def draw_weighted(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    """One index drawn with probability proportional to ``weights`` (>= 0, not all 0)."""
    total = float(weights.sum())
    if not total > 0.0:  # (p was a point mass on the rejected token: cannot happen with u < 1)
        return int(weights.argmax())
    return int(torch.multinomial(weights / total, 1, generator=generator))
