from __future__ import annotations

import math

import pytest
import torch

from anycore.kernels import reference
from anycore.kernels.build import load_extension

OP = "paged_attention"
pytestmark = pytest.mark.arm64


def _case(reqs, kv_heads, group, head_dim, dtype, slot_dtype=torch.int64, extra_cols=3):
    """reqs: (seq_len, new_tokens) per request; KV slots scattered over a shuffled pool."""
    heads = kv_heads * group
    total_slots = sum(s for s, _ in reqs) + 7
    k_cache = torch.randn(total_slots, kv_heads, head_dim, dtype=dtype)
    v_cache = torch.randn(total_slots, kv_heads, head_dim, dtype=dtype)
    perm = torch.randperm(total_slots)
    width = max(s for s, _ in reqs) + extra_cols
    table = torch.full((len(reqs), width), -1, dtype=slot_dtype)
    used = 0
    for i, (s, _) in enumerate(reqs):
        table[i, :s] = perm[used : used + s].to(slot_dtype)
        used += s
    q_lens = torch.tensor([n for _, n in reqs])
    q_start = torch.zeros(len(reqs) + 1, dtype=torch.int64)
    q_start[1:] = q_lens.cumsum(0)
    q = torch.randn(int(q_start[-1]), heads, head_dim, dtype=dtype)
    seq_lens = torch.tensor([s for s, _ in reqs], dtype=torch.int64)
    return q, k_cache, v_cache, q_start, seq_lens, table, 1.0 / math.sqrt(head_dim)


DT = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("head_dim", [64, 80, 128])
@pytest.mark.parametrize("kv_heads, group", [(2, 1), (1, 3), (2, 4)])
def test_mixed_batch(kernel, tol, dtype, head_dim, kv_heads, group):
    # decode (1 new), chunked prefill over a cached prefix, full prefill, odd lengths
    reqs = [(37, 1), (70, 13), (9, 9), (1, 1), (45, 1)]
    args = _case(reqs, kv_heads, group, head_dim, dtype)
    torch.testing.assert_close(kernel(*args), reference.paged_attention(*args), **tol(dtype))


@pytest.mark.parametrize("dtype", DT)
def test_head_dim_not_a_multiple_of_8(kernel, tol, dtype):
    # 44 = 32 + 8 + 4: every step of the bf16 dot products (BFDOT variants), partial vectors
    args = _case([(37, 1), (12, 12)], 2, 2, 44, dtype)
    torch.testing.assert_close(kernel(*args), reference.paged_attention(*args), **tol(dtype))


@pytest.mark.parametrize("dtype", DT)
def test_long_prefill_int32_slots(kernel, tol, dtype):
    # > 64 queries per request and > 32-key blocks; int32 slot table as the cache may hand out
    args = _case([(150, 150), (100, 67)], 2, 4, 64, dtype, slot_dtype=torch.int32)
    torch.testing.assert_close(kernel(*args), reference.paged_attention(*args), **tol(dtype))


def test_strided_query_view(kernel, tol):
    # q as a view into a fused qkv projection output (token stride > heads * head_dim)
    q, k, v, qs, sl, table, scale = _case([(20, 4), (6, 1)], 2, 2, 64, torch.float32)
    wide = torch.randn(q.shape[0], q.shape[1] + 3, q.shape[2])
    wide[:, : q.shape[1]] = q
    qv = wide[:, : q.shape[1]]
    torch.testing.assert_close(kernel(qv, k, v, qs, sl, table, scale),
                               reference.paged_attention(q, k, v, qs, sl, table, scale), **tol(torch.float32))


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("splits", [2, 3, 7])
def test_split_k(impl, dtype, splits, tol):
    """Forced split-K (used automatically for long decode with few items) matches the reference."""
    if impl == "torch-native":
        pytest.skip("split-K is a native-kernel path")
    idx = load_extension().variants.index(impl)
    for reqs in ([(300, 1), (97, 1)], [(150, 5), (40, 40)]):
        args = _case(reqs, 2, 4, 80, dtype)
        out = torch.ops.anycore.paged_attention(*args, idx, splits)
        torch.testing.assert_close(out, reference.paged_attention(*args), **tol(dtype))


@pytest.mark.parametrize("dtype", DT)
def test_short_extend_over_a_long_prefix_splits_its_keys(impl, dtype, tol):
    """A prefill-shaped extend whose items do not share out evenly (20 new tokens over 600
    cached keys, 3 kv heads: 3 items on 2 threads) is split in 2 key ranges, as a forced
    splits=2 call computes it; on 1 thread, or with a decode-shaped multi-token request in the
    batch (a verify keeps plain decoding's unsplit rows), it is not split."""
    if impl == "torch-native":
        pytest.skip("split-K is a native-kernel path")
    idx = load_extension().variants.index(impl)
    op = torch.ops.anycore.paged_attention
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        extend = _case([(620, 20)], 3, 3, 64, dtype)
        auto = op(*extend, idx, 0)
        assert torch.equal(auto, op(*extend, idx, 2))
        torch.testing.assert_close(auto, reference.paged_attention(*extend), **tol(dtype))
        # one item each (1 kv head): 3 on 2 threads, which would split without the 4-token verify
        with_verify = _case([(620, 20), (300, 4), (100, 1)], 1, 3, 64, dtype)
        assert torch.equal(op(*with_verify, idx, 0), op(*with_verify, idx, 1))
        torch.set_num_threads(1)
        assert torch.equal(op(*extend, idx, 0), op(*extend, idx, 1))
    finally:
        torch.set_num_threads(threads)


def test_empty_request_in_batch(kernel, tol):
    args = _case([(5, 2), (8, 0), (3, 3)], 1, 2, 64, torch.float32)
    torch.testing.assert_close(kernel(*args), reference.paged_attention(*args), **tol(torch.float32))
