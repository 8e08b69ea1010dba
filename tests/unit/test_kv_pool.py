"""KVPool: zero-initialised, but resident memory follows the slots written, not the budget."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from anycore.engine.runner import KVPool, lazy_zeros


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_lazy_zeros_reads_zero_and_is_writable():
    t = lazy_zeros((3, 5, 2, 4), torch.bfloat16)
    assert t.shape == (3, 5, 2, 4) and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert torch.count_nonzero(t) == 0 and not torch.isnan(t).any()
    t[1, 2].fill_(1.5)
    assert t.float().sum().item() == 1.5 * 8
    assert lazy_zeros((0, 4), torch.float32).shape == (0, 4)


def test_kv_pool_shapes_and_index_copy():
    pool = KVPool(num_layers=2, num_slots=64, num_kv_heads=3, head_dim=8, dtype=torch.bfloat16)
    assert pool.k.shape == pool.v.shape == (2, 64, 3, 8)
    assert pool.k.data_ptr() != pool.v.data_ptr()
    new = torch.randn(4, 3, 8).to(torch.bfloat16)
    pool.k[1].index_copy_(0, torch.tensor([0, 5, 6, 63]), new)
    assert torch.equal(pool.k[1, 5], new[1]) and torch.count_nonzero(pool.k[0]) == 0
    assert torch.count_nonzero(pool.v) == 0
    assert KVPool.bytes_per_slot(2, 3, 8, torch.bfloat16) == 2 * 2 * 3 * 8 * 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_kv_pool_rss_follows_written_slots():
    before = _rss_bytes()
    pool = KVPool(num_layers=4, num_slots=1 << 16, num_kv_heads=4, head_dim=64, dtype=torch.bfloat16)  # 256 MiB
    allocated = _rss_bytes() - before
    assert allocated < 16 << 20, f"creating the pool made {allocated >> 20} MiB resident"
    # reading untouched pages (as attention over a fresh pool would) maps the shared zero page
    assert torch.count_nonzero(pool.k[0, :4096]) == 0
    slots = torch.arange(100)
    for layer in range(4):
        pool.k[layer].index_copy_(0, slots, torch.ones(100, 4, 64, dtype=torch.bfloat16))
        pool.v[layer].index_copy_(0, slots, torch.ones(100, 4, 64, dtype=torch.bfloat16))
    written = _rss_bytes() - before
    assert written < 24 << 20, f"100 slots made {written >> 20} MiB resident"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_discard_returns_written_pages_and_reads_zero():
    pool = KVPool(num_layers=2, num_slots=1 << 16, num_kv_heads=4, head_dim=64, dtype=torch.bfloat16)  # 128 MiB
    before = _rss_bytes()
    pool.k.fill_(1.0)
    pool.v[1, :100].fill_(2.0)
    assert _rss_bytes() - before > 48 << 20
    pool.discard()
    assert _rss_bytes() - before < 8 << 20
    assert torch.count_nonzero(pool.k) == 0 and torch.count_nonzero(pool.v) == 0
    pool.k[0, 7].fill_(3.0)  # still writable, through the same tensors (views taken before stay valid)
    assert pool.k.float().sum().item() == 3.0 * 4 * 64


def test_kv_pool_with_a_window_pool_splits_layers_and_sizes():
    from anycore.engine.engine import kv_window_split

    pool = KVPool(num_layers=4, num_slots=64, num_kv_heads=2, head_dim=8, dtype=torch.float32,
                  window_layers=(0, 1, 3), num_window_slots=16)
    assert pool.k.shape == (1, 64, 2, 8) and pool.k_window.shape == pool.v_window.shape == (3, 16, 2, 8)
    assert [t.shape[0] for t in pool.k_layers] == [16, 16, 64, 16]
    pool.k_layers[3][5].fill_(2.0)
    assert pool.k_window[2, 5].sum() == 32 and torch.count_nonzero(pool.k) == 0
    pool.discard()
    assert torch.count_nonzero(pool.k_window) == 0
    # one pool without sliding layers; with them the global layers' pool grows and the window
    # pool holds half as many tokens, but never fewer than the floor asked for
    per = KVPool.bytes_per_slot(1, 1, 256, torch.bfloat16)
    assert kv_window_split(18 * per * 1000, 18, 0, 1, 256, torch.bfloat16, 0) == (1000, 0)
    n, w = kv_window_split(18 * per * 1000, 18, 15, 1, 256, torch.bfloat16, 100)
    assert (n, w) == (1714, 857) and 3 * n + 15 * w <= 18 * 1000
    # (the floor: the global pool shrinks to fit it; too high a floor: one pool's token count)
    assert kv_window_split(18 * per * 1000, 18, 15, 1, 256, torch.bfloat16, 900) == (1500, 900)
    assert kv_window_split(18 * per * 1000, 18, 15, 1, 256, torch.bfloat16, 5000) == (1000, 1000)
