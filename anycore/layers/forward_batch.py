"""The tensors one forward pass needs, built by the runner from a SchedulerOutput."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class ForwardBatch:
    """A flat batch of new tokens from several requests (prefill chunks and decodes mixed).

    Invariant: request i's new tokens are rows ``q_start_loc[i]:q_start_loc[i+1]`` and are the
    last tokens of its sequence of ``seq_lens[i]`` tokens whose KV slots are ``slot_table[i]``.
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64: where each new token's K/V is written
    q_start_loc: torch.Tensor  # [B + 1] int64
    seq_lens: torch.Tensor  # [B] int64
    slot_table: torch.Tensor  # [B, max_seq_len] int64
    logits_indices: torch.Tensor  # [B'] rows whose next-token logits are wanted
    # per layer: the [num_slots, num_kv_heads, head_dim] view of the pool (views made once, so
    # a layer's lookup is a list index rather than a tensor op)
    k_cache: Sequence[torch.Tensor]
    v_cache: Sequence[torch.Tensor]
    # the whole pools, [num_layers, num_slots, num_kv_heads, head_dim] (for the one-call native
    # layer stack); None where a caller has only per-layer caches
    k_pool: torch.Tensor | None = None
    v_pool: torch.Tensor | None = None
    # sliding window -> (seq_lens, slot_table) of the window's slots for a decode-only batch, or
    # None (anycore.layers.attention.decode_window_view; made once per batch, shared by layers)
    window_views: dict[int, tuple[torch.Tensor, torch.Tensor] | None] = field(default_factory=dict)
    # EAGLE drafting (anycore/spec/eagle.py) reads target hidden states of every new row. None
    # (the default): nothing captured, no cost. () : the final normed hidden state (EAGLE-1/2);
    # layer indices: the residual stream entering each of those layers, concatenated (EAGLE-3;
    # index num_layers = the stream after the last layer). The model writes them to ``captured``.
    capture_layers: tuple[int, ...] | None = None
    # a speculative tree verify in the batch: [T, max new tokens] which new tokens of its own
    # request each row sees (the tree_attention op; causal rows for the other requests)
    tree_mask: torch.Tensor | None = None
    captured: torch.Tensor | None = None
    # sliding-window layers kept in a window pool (anycore/cache/swa.py): ``slot_mapping`` and
    # ``slot_table`` translated to window slots (entries behind every query's window point at
    # slot 0 and are never read); None: sliding layers share the full pool's slots
    window_slot_mapping: torch.Tensor | None = None
    window_slot_table: torch.Tensor | None = None
