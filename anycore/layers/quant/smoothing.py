"""SmoothQuant-style smoothing before W8A8 quantization.

Per-token int8 activations lose precision when a few input channels are much larger than the
rest (they set the token's scale). For a linear ``y = x W^T`` whose input is produced by an op
that can absorb a per-channel factor, we divide that producer's output channel j by ``s_j``
and multiply column j of W by ``s_j``: the float result is unchanged, but activation outliers
shrink and the weights take part of the range. ``s_j = a_j^alpha / w_j^(1-alpha)`` with
``a_j`` the largest |x_j| seen on a calibration text and ``w_j`` the largest |W[:, j]|.

Producers that can absorb the factor: an RMSNorm weight (feeding q/k/v and gate/up), and the
rows of the up projection (feeding down, since silu(g) * u is linear in u).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import torch

from anycore.layers.linear import Linear


@dataclass
class SmoothPair:
    """``linear``'s input channels come out of ``producer`` rows ``rows`` (a 1-D norm weight
    or a 2-D weight whose rows, plus ``producer_bias``, make those channels)."""

    linear: Linear
    producer: torch.Tensor
    producer_bias: torch.Tensor | None = None


def calibration_token_ids(tokenizer, vocab_size: int, max_tokens: int = 2048) -> list[int]:
    """A short mixed text (prose, dialogue, Q&A, code, numbers) shipped with anycore, tokenized
    (ids folded into the model's vocabulary in case the tokenizer's is larger)."""
    text = resources.files("anycore.layers.quant").joinpath("calibration.txt").read_text(encoding="utf-8")
    return [t % vocab_size for t in tokenizer.encode(text)[:max_tokens]]


@torch.inference_mode()
def collect_input_absmax(linears: list[Linear], run_forward) -> dict[int, torch.Tensor]:
    """Per-input-channel max |x| of each linear while ``run_forward()`` runs the model."""
    stats: dict[int, torch.Tensor] = {}

    def hook(module, inputs):
        amax = inputs[0].detach().float().abs().amax(dim=0)
        key = id(module)
        stats[key] = torch.maximum(stats[key], amax) if key in stats else amax

    handles = [lin.register_forward_pre_hook(hook) for lin in linears]
    try:
        run_forward()
    finally:
        for h in handles:
            h.remove()
    return stats


@torch.inference_mode()
def smooth(pairs: list[SmoothPair], absmax: dict[int, torch.Tensor], alpha: float = 0.5) -> None:
    for pair in pairs:
        lin = pair.linear
        a = absmax[id(lin)].clamp(min=1e-5)
        w = lin.weight.data.float()
        s = (a.pow(alpha) / w.abs().amax(dim=0).clamp(min=1e-5).pow(1 - alpha)).clamp(min=1e-5)
        lin.weight.data.copy_(w * s[None, :])
        p = pair.producer
        if p.dim() == 1:
            p.data.copy_(p.data.float() / s)
        else:
            p.data.copy_(p.data.float() / s[:, None])
        if pair.producer_bias is not None:
            pair.producer_bias.data.copy_(pair.producer_bias.data.float() / s)
