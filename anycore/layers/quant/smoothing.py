"""SmoothQuant-style smoothing before W8A8 quantization.

Per-token int8 activations lose precision when a few input channels are much larger than the
rest (they set the token's scale). For a linear ``y = x W^T`` whose input is produced by an op
that can absorb a per-channel factor, we divide that producer's output channel j by ``s_j``
and multiply column j of W by ``s_j``: the float result is unchanged, but activation outliers
shrink and the weights take part of the range. ``s_j = a_j^alpha / w_j^(1-alpha)`` with
``a_j`` the root mean square of x_j over a calibration text and ``w_j`` the largest |W[:, j]|.

SmoothQuant's ``a_j`` is the largest |x_j| instead; on SmolLM2-135M that is worse (KL divergence
from the float model 0.0137 vs 0.0106 with the RMS, fp32, 8k WikiText tokens): a channel's max
is often set by a handful of tokens, and shrinking the channel to it for every token costs the
weights range that typical tokens needed.

``alpha`` is chosen per pair: each value of ``ALPHA_GRID`` is tried on a sample of the
calibration inputs, and the one whose simulated W8A8 output (int8 weights per channel, int8
activations per token) is closest to the float output in mean squared error is kept.

Producers that can absorb the factor: an RMSNorm weight (feeding q/k/v and gate/up), the rows
of the up projection (feeding down, since silu(g) * u is linear in u), and the rows of the v
projection (feeding o: attention mixes v rows over positions, never across channels). With
grouped-query attention one v row feeds the same channel of every query head in its group, so
those o-input channels share one factor (``producer_rows`` maps them to it).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import torch
from torch import nn
from tqdm import tqdm

from anycore.kernels.int8 import quantize_per_token, quantize_weight_per_channel
from anycore.layers.linear import Linear

ALPHA_GRID = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
# output channels the alpha search scores per linear: all of SmolLM2-135M's (at most 3072); a
# 1.7B model's 16384-wide gate_up is scored on a quarter of them, 4x less quantizing per alpha
SEARCH_ROWS = 4096


@dataclass
class SmoothPair:
    """``linear``'s input channel j comes out of ``producer`` row ``producer_rows[j]`` (a 1-D
    norm weight, or a 2-D weight whose rows, plus ``producer_bias``, make those channels);
    ``producer_rows`` None means row j."""

    linear: Linear
    producer: torch.Tensor
    producer_bias: torch.Tensor | None = None
    producer_rows: torch.Tensor | None = None


def gqa_rows(num_heads: int, num_kv_heads: int, head_dim: int) -> torch.Tensor:
    """The v row that feeds each attention-output channel (head-major, ``num_heads * head_dim``)."""
    group = num_heads // num_kv_heads
    heads = torch.arange(num_heads) // group
    return (heads[:, None] * head_dim + torch.arange(head_dim)[None, :]).flatten()


def calibration_token_ids(tokenizer, vocab_size: int, max_tokens: int = 4096) -> list[int]:
    """A mixed text written for anycore (prose, encyclopedic, dialogue, Q&A, code, data, a few
    other languages; no evaluation data), tokenized, ids folded into the model's vocabulary in
    case the tokenizer's is larger."""
    text = resources.files("anycore.layers.quant").joinpath("calibration.txt").read_text(encoding="utf-8")
    return [t % vocab_size for t in tokenizer.encode(text)[:max_tokens]]


@dataclass
class InputStats:
    absmax: torch.Tensor  # [in_features] fp32, largest |x_j| over all calibration tokens
    rms: torch.Tensor  # [in_features] fp32, root mean square of x_j over all calibration tokens
    sample: torch.Tensor  # [rows, in_features] bf16, every ``stride``-th calibration token


@torch.inference_mode()
def collect_input_stats(linears: list[nn.Module], run_forward, stride: int = 6,
                        max_rows: int = 512) -> dict[int, InputStats]:
    """Per-channel max |x| and RMS of each linear's input while ``run_forward()`` runs the
    model, and an evenly spaced sample of at most ``max_rows`` input rows (for the alpha search)."""
    absmax: dict[int, torch.Tensor] = {}
    sumsq: dict[int, torch.Tensor] = {}
    count: dict[int, int] = {}
    rows: dict[int, list[torch.Tensor]] = {}

    def hook(module, inputs):
        x = inputs[0].detach().reshape(-1, inputs[0].shape[-1])
        xf = x.float()
        amax, sq = xf.abs().amax(dim=0), xf.pow(2).sum(dim=0)
        key = id(module)
        absmax[key] = torch.maximum(absmax[key], amax) if key in absmax else amax
        sumsq[key] = sumsq[key] + sq if key in sumsq else sq
        count[key] = count.get(key, 0) + x.shape[0]
        # a copy: a view (what .to() returns for bf16 input) would keep the whole input alive
        rows.setdefault(key, []).append(x[::stride].to(torch.bfloat16, copy=True))

    handles = [lin.register_forward_pre_hook(hook) for lin in linears]
    try:
        run_forward()
    finally:
        for h in handles:
            h.remove()
    stats = {}
    for key, parts in rows.items():
        sample = torch.cat(parts)
        if sample.shape[0] > max_rows:
            sample = sample[torch.linspace(0, sample.shape[0] - 1, max_rows).long()]
        stats[key] = InputStats(absmax[key], (sumsq[key] / count[key]).sqrt(), sample)
    return stats


def smoothing_factors(pair: SmoothPair, act: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """``s`` per input channel of ``pair.linear`` from the activation statistic ``act``, equal
    within channels that share a producer row."""
    return factors(act, weight.abs().amax(dim=0), alpha, pair.producer_rows)


def factors(act: torch.Tensor, w_colmax: torch.Tensor, alpha: float,
            producer_rows: torch.Tensor | None = None) -> torch.Tensor:
    """``s_j = a_j^alpha / w_j^(1-alpha)`` from a per-channel activation statistic and the
    weight's per-input-channel max |w|; channels that share a producer row share one factor."""
    a = act.clamp(min=1e-5)
    w = w_colmax.clamp(min=1e-5)
    if producer_rows is not None:
        n = int(producer_rows.max()) + 1
        idx = producer_rows
        a = torch.zeros(n).scatter_reduce(0, idx, a, "amax", include_self=False)[idx]
        w = torch.zeros(n).scatter_reduce(0, idx, w, "amax", include_self=False)[idx]
    return (a.pow(alpha) / w.pow(1 - alpha)).clamp(min=1e-5)


def w8a8_error(x: torch.Tensor, weight: torch.Tensor, s: torch.Tensor, reference: torch.Tensor) -> float:
    """Mean squared difference between the simulated W8A8 output of the smoothed linear and the
    float output. The int8 products are summed in float64, exact (|sum| < 2^53) like the kernels'
    int32, and fast on every CPU: torch._int_mm has no fast kernel on x86 without VNNI (Zen 3:
    ~60x slower than an fp32 GEMM), where the search took minutes per model."""
    wq, ws = quantize_weight_per_channel(weight * s)
    xq, xs = quantize_per_token(x / s)
    acc = (xq.double() @ wq.double().t()).float()
    y = acc * xs[:, None] * ws[None, :]
    return float((y - reference).pow(2).mean())


def search_alpha(pair: SmoothPair, stats: InputStats, grid=ALPHA_GRID, max_rows: int = SEARCH_ROWS) -> float:
    """The grid's alpha with the least simulated W8A8 output error for ``pair``."""
    return best_alpha(pair.linear.weight.data.float(), stats, pair.producer_rows, grid, max_rows)


def best_alpha(weight: torch.Tensor, stats: InputStats, producer_rows: torch.Tensor | None = None,
               grid=ALPHA_GRID, max_rows: int = SEARCH_ROWS, or_none: bool = False,
               colmax: torch.Tensor | None = None) -> float | None:
    """The grid's alpha whose factors (from ``stats.rms`` and the weight's per-input-channel max
    |w|, ``colmax`` when given: ``weight`` is then rows sampled from a larger one) give the least
    simulated W8A8 output error on ``stats.sample``; with ``or_none``, None when leaving the
    weight unsmoothed gives less still. The error is a mean over output channels: a weight with
    more than ``max_rows`` of them is scored on that many evenly spaced ones (rows quantize
    independently)."""
    if colmax is None:
        colmax = weight.abs().amax(dim=0)
    if weight.shape[0] > max_rows:
        weight = weight[torch.linspace(0, weight.shape[0] - 1, max_rows).long()]
    x = stats.sample.float()
    reference = x @ weight.t()
    errors = [(w8a8_error(x, weight, factors(stats.rms, colmax, a, producer_rows), reference), a) for a in grid]
    best = min(errors)
    if or_none and w8a8_error(x, weight, torch.ones_like(colmax), reference) <= best[0]:
        return None
    return best[1]


@torch.inference_mode()
def apply_smoothing(pair: SmoothPair, s: torch.Tensor) -> None:
    lin = pair.linear
    lin.weight.data.copy_(lin.weight.data.float() * s[None, :])
    if pair.producer_rows is not None:  # one factor per producer row (shared channels agree)
        s = torch.ones(pair.producer.shape[0]).index_copy_(0, pair.producer_rows, s)
    p = pair.producer
    p.data.copy_(p.data.float() / (s if p.dim() == 1 else s[:, None]))
    if pair.producer_bias is not None:
        pair.producer_bias.data.copy_(pair.producer_bias.data.float() / s)


@torch.inference_mode()
def smooth(pairs: list[SmoothPair], stats: dict[int, InputStats], alpha: float | None = None) -> list[float]:
    """Smooths every pair (alpha searched per pair when None); returns the alphas used."""
    used = []
    for pair in tqdm(pairs, desc="smoothing", unit="linear", disable=None, leave=False):
        st = stats[id(pair.linear)]
        a = search_alpha(pair, st) if alpha is None else alpha
        apply_smoothing(pair, smoothing_factors(pair, st.rms, pair.linear.weight.data.float(), a))
        used.append(a)
    return used
