"""Sliding-window (and soft-capped) paged attention: each implementation against the reference,
the reference against a dense whole-sequence formula, and keys outside the window never read."""

from __future__ import annotations

import math

import pytest
import torch

from anycore.kernels import reference

OP = "paged_attention_window"
pytestmark = pytest.mark.arm64

DT = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
# decode (1 new) near and far past the window, chunked prefill over a cached prefix longer than
# the window, a full prefill, a request shorter than the window, a one-token sequence
REQS = [(37, 1), (70, 13), (9, 9), (5, 1), (1, 1), (45, 1), (23, 20)]


def _case(reqs, kv_heads, group, head_dim, dtype, slot_dtype=torch.int64):
    """reqs: (seq_len, new_tokens) per request; KV slots scattered over a shuffled pool."""
    total = sum(s for s, _ in reqs) + 5
    k_cache = torch.randn(total, kv_heads, head_dim, dtype=dtype)
    v_cache = torch.randn(total, kv_heads, head_dim, dtype=dtype)
    perm = torch.randperm(total)
    table = torch.full((len(reqs), max(s for s, _ in reqs) + 3), -1, dtype=slot_dtype)
    used = 0
    for i, (s, _) in enumerate(reqs):
        table[i, :s] = perm[used : used + s].to(slot_dtype)
        used += s
    q_start = torch.zeros(len(reqs) + 1, dtype=torch.int64)
    q_start[1:] = torch.tensor([n for _, n in reqs]).cumsum(0)
    q = torch.randn(int(q_start[-1]), kv_heads * group, head_dim, dtype=dtype)
    seq_lens = torch.tensor([s for s, _ in reqs], dtype=torch.int64)
    return q, k_cache, v_cache, q_start, seq_lens, table, 1.0 / math.sqrt(head_dim)


def _dense(q, k_cache, v_cache, q_start, seq_lens, table, scale, window, softcap):
    """Whole-sequence attention with transformers' sliding mask (kv > q - window), per request."""
    out = torch.empty(q.shape, dtype=torch.float32)
    group = q.shape[1] // k_cache.shape[1]
    for i, s in enumerate(seq_lens.tolist()):
        a, b = int(q_start[i]), int(q_start[i + 1])
        k = k_cache[table[i, :s].long()].float().repeat_interleave(group, 1)
        v = v_cache[table[i, :s].long()].float().repeat_interleave(group, 1)
        scores = torch.einsum("nhd,lhd->hnl", q[a:b].float(), k) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        qp = torch.arange(s - (b - a), s)[:, None]
        kp = torch.arange(s)[None, :]
        allowed = (kp <= qp) & ((kp > qp - window) if window else True)
        out[a:b] = torch.einsum("hnl,lhd->nhd", scores.masked_fill(~allowed, -math.inf).softmax(-1), v)
    return out


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("window", [1, 4, 17, 1000])
@pytest.mark.parametrize("kv_heads, group, head_dim", [(2, 1, 64), (1, 3, 44), (2, 2, 256)])
def test_matches_the_reference(kernel, tol, dtype, window, kv_heads, group, head_dim):
    args = _case(REQS, kv_heads, group, head_dim, dtype)
    torch.testing.assert_close(kernel(*args, window, 0.0), reference.paged_attention_window(*args, window, 0.0),
                               **tol(dtype))


@pytest.mark.parametrize("softcap", [0.0, 1.5])
@pytest.mark.parametrize("window", [0, 3, 17])
def test_reference_is_the_dense_formula(softcap, window):
    args = _case(REQS, 2, 2, 40, torch.float32)
    torch.testing.assert_close(reference.paged_attention_window(*args, window, softcap),
                               _dense(*args, window, softcap), rtol=1e-5, atol=1e-5)


def test_soft_capped(kernel, tol):
    args = _case(REQS, 1, 4, 32, torch.float32)
    args = (args[0] * 4, *args[1:])  # large scores, so the cap bites
    torch.testing.assert_close(kernel(*args, 5, 2.0), reference.paged_attention_window(*args, 5, 2.0),
                               **tol(torch.float32))


def test_no_window_is_plain_paged_attention(kernel, tol):
    args = _case(REQS, 2, 2, 64, torch.float32, slot_dtype=torch.int32)
    torch.testing.assert_close(kernel(*args, 0, 0.0), reference.paged_attention(*args), **tol(torch.float32))


@pytest.mark.parametrize("window", [1, 6])
def test_keys_outside_the_window_are_never_read(kernel, window):
    """K/V of every position older than all of a request's windows set to NaN: the output
    stays finite and equal (a kernel that read them, even masked, would propagate NaN)."""
    q, k_cache, v_cache, q_start, seq_lens, table, scale = _case(REQS, 2, 2, 32, torch.float32)
    clean = kernel(q, k_cache, v_cache, q_start, seq_lens, table, scale, window, 0.0)
    for i, s in enumerate(seq_lens.tolist()):
        n = int(q_start[i + 1] - q_start[i])
        first = reference.window_start(s, n, window)
        stale = table[i, :first].long()
        k_cache[stale] = float("nan")
        v_cache[stale] = float("nan")
    poisoned = kernel(q, k_cache, v_cache, q_start, seq_lens, table, scale, window, 0.0)
    assert torch.isfinite(poisoned).all()
    torch.testing.assert_close(poisoned, clean, rtol=0, atol=0)


def test_window_start():
    assert reference.window_start(100, 1, 8) == 92  # the decode query at 99 sees 92..99
    assert reference.window_start(100, 10, 8) == 83  # the first of 10 queries (at 90) sees 83..
    assert reference.window_start(5, 5, 8) == 0
    assert reference.window_start(100, 1, 0) == 0  # no window


def _batch(q_start, seq_lens, table):
    from anycore.layers.forward_batch import ForwardBatch

    none = torch.empty(0, dtype=torch.int64)
    return ForwardBatch(none, none, none, q_start, seq_lens, table, none, [], [])


@pytest.mark.parametrize("window", [1, 5, 40, 1000])
def test_decode_window_view_is_the_window(window):
    """The decode-only shortcut of the attention layer: plain paged attention over each
    request's last ``window`` slots equals the windowed op, and holds no older slot."""
    from anycore.layers.attention import decode_window_view

    decodes = [(37, 1), (5, 1), (1, 1), (45, 1), (12, 1)]
    q, k_cache, v_cache, q_start, seq_lens, table, scale = _case(decodes, 2, 2, 32, torch.float32)
    view = decode_window_view(_batch(q_start, seq_lens, table), window)
    assert view is not None
    lens, rows = view
    for i, s in enumerate(seq_lens.tolist()):
        assert rows[i, : lens[i]].tolist() == table[i, max(0, s - window) : s].tolist()
    torch.testing.assert_close(reference.paged_attention(q, k_cache, v_cache, q_start, lens, rows, scale),
                               reference.paged_attention_window(q, k_cache, v_cache, q_start, seq_lens, table, scale,
                                                                window, 0.0), rtol=1e-6, atol=1e-6)
    mixed = _case(REQS, 2, 2, 32, torch.float32)
    assert decode_window_view(_batch(mixed[3], mixed[4], mixed[5]), window) is None


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("window", [40, 300])
def test_long_decodes_split_over_the_window(kernel, tol, dtype, window):
    """A lone decode over a long context: native kernels split its keys ("flash decoding") over
    the window only; the split parts must merge to the reference."""
    args = _case([(600, 1)], 1, 4, 64, dtype)
    torch.testing.assert_close(kernel(*args, window, 0.0), reference.paged_attention_window(*args, window, 0.0),
                               **tol(dtype))
    args = _case([(600, 1), (333, 1)], 2, 2, 64, dtype)
    torch.testing.assert_close(kernel(*args, window, 1.5), reference.paged_attention_window(*args, window, 1.5),
                               **tol(dtype))


@pytest.mark.parametrize("dtype", DT)
def test_a_window_past_the_sequence_is_paged_attention_bit_for_bit(impl, dtype):
    """No window (0) or one no query reaches past: a native variant runs paged_attention's own
    steps, so its output is bit-identical to that variant's paged_attention (what the decode
    view of the attention layer relies on)."""
    from anycore.kernels.dispatch import make_op

    if impl in ("reference", "torch-native"):
        pytest.skip("a property of the native kernel")
    args = _case(REQS, 2, 2, 64, dtype)
    plain = make_op("paged_attention", impl)(*args)
    assert torch.equal(make_op(OP, impl)(*args, 0, 0.0), plain)
    assert torch.equal(make_op(OP, impl)(*args, 1000, 0.0), plain)
