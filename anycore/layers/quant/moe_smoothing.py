"""SmoothQuant-style smoothing of a sparse MLP's experts before W8A8 (see smoothing.py).

Two places in an MoE layer can absorb a per-channel factor:

- The post-attention RMSNorm feeds the router, every expert's gate/up rows and, in Qwen2-MoE,
  the shared expert and its gate. One factor per hidden channel is folded into the norm weight
  and multiplies that column of every reader: the quantized ones (experts' w13, the shared
  expert's gate_up), whose per-channel max |w| sets the factor, and the float ones (router,
  shared-expert gate), for which the float result is unchanged. The activation statistic is
  the norm's output over the calibration text (what the router reads: every token), and alpha
  is searched on evenly spaced gate/up rows of all the experts against every sampled token.
- Each expert's down projection reads silu(g) * u of the tokens routed to it; as for the dense
  MLP, a factor per intermediate channel is folded into that expert's up rows. Its statistic
  comes from replaying the router-input sample through the (smoothed, float) router and that
  expert; an expert that fewer than ``MIN_EXPERT_ROWS`` sampled tokens reach keeps factor 1
  (too few rows to estimate a channel's scale, and the error search would fit noise).

With alpha searched, each place is smoothed only where that helps: when the simulated W8A8
error of the unsmoothed weights is the least, they stay as they are (random-weight test models
have no outlier channels; trained ones do). The experts' down searches run ``EXPERT_GROUP``
experts per quantization call, each scored on ``EXPERT_SEARCH_ROWS`` evenly spaced output
channels (one call per expert and every channel made a 64-expert, 12-layer model's load spend
~16 s here).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from anycore.kernels.int8 import quantize_weight_per_channel, w8a8_linear_torch
from anycore.kernels.moe import route
from anycore.layers.moe import SparseMoeBlock, StackedExperts
from anycore.layers.quant.smoothing import ALPHA_GRID, SEARCH_ROWS, InputStats, best_alpha, factors

MIN_EXPERT_ROWS = 16
EXPERT_GROUP = 16
EXPERT_SEARCH_ROWS = SEARCH_ROWS // EXPERT_GROUP  # output channels scored per expert


@dataclass
class SparseMlpSmoothing:
    """``block``'s input is ``norm`` (a 1-D RMSNorm weight) times the normalised hidden state."""

    block: SparseMoeBlock
    norm: torch.Tensor


@torch.inference_mode()
def smooth_sparse_mlp(item: SparseMlpSmoothing, stats: InputStats, alpha: float | None = None) -> list[float | None]:
    """Smooths one layer's experts in place (float weights, before ``quantize_w8a8``) from the
    statistics of its router's input; ``alpha`` None: searched, and a place is left unsmoothed
    where that measures better. Returns the alphas used, None where left (the norm side first,
    then the down projection of each expert enough sampled tokens reach, by expert)."""
    block, experts = item.block, item.block.experts
    if experts.int8:
        raise ValueError("smooth_sparse_mlp: the experts are already int8")
    s = _smooth_norm_side(block, item.norm, stats, alpha)
    used: list[float | None] = [s[1]]
    x = stats.sample.float() / s[0]  # what the smoothed norm puts out
    _, ids = route(F.linear(x, block.gate.weight.float()), experts.top_k, experts.renormalize)
    i, w13 = experts.intermediate_size, experts.w13.data
    inputs = {}  # expert -> the down projection's input rows of its sampled tokens
    for e in range(experts.num_experts):
        mine = (ids == e).any(dim=-1)
        if int(mine.sum()) >= MIN_EXPERT_ROWS:
            gate_up = F.linear(x[mine], w13[e].float())
            inputs[e] = F.silu(gate_up[:, :i]) * gate_up[:, i:]
    chosen = sorted(inputs)
    for g in range(0, len(chosen), EXPERT_GROUP):
        group = chosen[g : g + EXPERT_GROUP]
        used += _smooth_downs(experts, group, [inputs[e] for e in group], alpha)
    return used


def _smooth_norm_side(block: SparseMoeBlock, norm: torch.Tensor, stats: InputStats,
                      alpha: float | None) -> tuple[torch.Tensor, float | None]:
    """(the factor per hidden channel, the alpha; ones and None when left unsmoothed)."""
    w13 = block.experts.w13.data
    rows = w13.view(-1, w13.shape[-1])
    colmax = rows.abs().amax(dim=0).float()
    readers = [rows, block.gate.weight.data]
    sampled = rows[torch.linspace(0, rows.shape[0] - 1, min(rows.shape[0], SEARCH_ROWS)).long()].float()
    if block.shared_expert is not None:
        shared = block.shared_expert.gate_up_proj.weight.data
        colmax = torch.maximum(colmax, shared.abs().amax(dim=0).float())
        sampled = torch.cat([sampled, shared.float()])
        readers += [shared, block.shared_expert_gate.weight.data]
    a = best_alpha(sampled, stats, or_none=True, colmax=colmax) if alpha is None else alpha
    if a is None:
        return torch.ones_like(colmax), None
    s = factors(stats.rms, colmax, a)
    norm.copy_(norm.float() / s)  # the norm's output channel j shrinks by s_j, every reader's column j grows by it
    for w in readers:
        w.copy_(w.float() * s)
    return s, a


def _smooth_downs(experts: StackedExperts, group: list[int], inputs: list[torch.Tensor], alpha: float | None) -> list[float | None]:
    """Each expert of ``group``'s down projection smoothed into its up rows; the alphas used."""
    i = experts.intermediate_size
    down = experts.w2.data[group].float()  # [n, H, I]
    colmax = down.abs().amax(dim=1)
    rms = torch.stack([x.pow(2).mean(dim=0).sqrt() for x in inputs])  # [n, I]
    h = min(down.shape[1], EXPERT_SEARCH_ROWS)  # (scored on evenly spaced output channels, as best_alpha does)
    scored = down[:, torch.linspace(0, down.shape[1] - 1, h).long()]
    n = down.shape[0]
    reference = [x @ scored[j].t() for j, x in enumerate(inputs)]

    def errors(s: torch.Tensor) -> list[float]:  # s [n, I] -> each expert's simulated W8A8 error
        q, scale = quantize_weight_per_channel((scored * s[:, None, :]).view(-1, i))
        q, scale = q.view(n, h, i), scale.view(n, h)
        return [float((w8a8_linear_torch(x / s[j], q[j].t().contiguous(), scale[j]) - reference[j]).pow(2).mean())
                for j, x in enumerate(inputs)]

    grid = ALPHA_GRID if alpha is None else (alpha,)
    by_alpha = {a: errors(factors(rms, colmax, a)) for a in grid}
    if alpha is None:
        by_alpha[None] = errors(torch.ones_like(rms))
    used = []
    for j, e in enumerate(group):
        # least error; on a tie the unsmoothed weights, then the smaller alpha
        a_e = min(by_alpha, key=lambda a: (by_alpha[a][j], a is not None, a or 0.0)) if alpha is None else alpha
        used.append(a_e)
        if a_e is None:
            continue
        s_e = factors(rms[j], colmax[j], a_e)
        experts.w2.data[e].copy_(down[j] * s_e)
        experts.w13.data[e, i:].copy_(experts.w13.data[e, i:].float() / s_e[:, None])
    return used
