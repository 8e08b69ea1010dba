"""tree_attention: every implementation against the reference (odd shapes: trees, causal extends and
decodes in one batch, GQA, head dims 64 and 80, fp32 and bf16 KV, trees across key blocks); a
lower-triangular mask is causal paged attention (bit for bit on the native kernels, which run
paged_attention's code); a tree node's output equals causal attention over the prefix and its
own root-to-node path laid out as a plain sequence."""

from __future__ import annotations

import math

import pytest
import torch

from anycore.kernels import reference
from anycore.kernels.build import load_extension
from anycore.kernels.ops import spec
from anycore.kernels.tree_attention import tree_attention_reference
from anycore.spec.tree import ancestor_mask

OP = "tree_attention"
pytestmark = pytest.mark.arm64

H, KV, D = 4, 2, 16
DT = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
PARENTS = [-1, -1, 0, 0, 1, 2, 5]  # nodes 0..6 after the root; -1: a child of the root


def _batch(dtype, prefix=(5, 0, 9), n_new=(8, 3, 1)):
    """Three requests: a tree verify (8 new), a causal extend (3), a decode (1)."""
    g = torch.Generator().manual_seed(0)
    lens = [p + n for p, n in zip(prefix, n_new)]
    slots = torch.randperm(64, generator=g)[: sum(lens)]
    table = torch.zeros(3, max(lens), dtype=torch.int64)
    at = 0
    for i, n in enumerate(lens):
        table[i, :n] = slots[at : at + n]
        at += n
    k_cache = torch.randn(64, KV, D, generator=g).to(dtype)
    v_cache = torch.randn(64, KV, D, generator=g).to(dtype)
    q = torch.randn(sum(n_new), H, D, generator=g).to(dtype)
    q_start = torch.tensor([0, n_new[0], n_new[0] + n_new[1], sum(n_new)])
    mask = torch.zeros(sum(n_new), max(n_new), dtype=torch.bool)
    mask[:8, :8] = ancestor_mask(PARENTS)
    mask[8:11, :3] = torch.ones(3, 3, dtype=torch.bool).tril()
    mask[11, 0] = True
    return q, k_cache, v_cache, q_start, torch.tensor(lens), table, mask


def _random_parents(n: int, g: torch.Generator) -> list[int]:
    """A random tree of n nodes after the root, parents first (each parent in -1 .. j - 1)."""
    return [int(torch.randint(-1, j, (1,), generator=g)) if j else -1 for j in range(n)]


# (prefix, tree nodes after the root) for a tree verify, (prefix, new tokens) for a causal extend
# or decode: a tree past one key block (33 new keys), a star whose last nodes see no other node
# of two key blocks, a tree with no prefix, a prefill, decodes and a chunk over a cached prefix
TREES = {0: (37, 12), 2: (29, 40), 4: (0, 6), 6: (60, 44)}
CAUSAL = {1: (70, 13), 3: (45, 1), 5: (9, 9), 7: (1, 1)}


def _mixed(kv_heads, group, head_dim, dtype, seed=0, extra_cols=2):
    """A batch of TREES and CAUSAL requests (in index order) over a shuffled slot pool, and its
    mask: ancestor_mask for the trees (request 6 a star), lower-triangular rows elsewhere,
    `extra_cols` columns more than the widest request."""
    g = torch.Generator().manual_seed(seed)
    reqs = [TREES[i] if i in TREES else CAUSAL[i] for i in range(len(TREES) + len(CAUSAL))]
    n_new = [n + 1 if i in TREES else n for i, (_, n) in enumerate(reqs)]
    lens = [p + n for (p, _), n in zip(reqs, n_new)]
    total = sum(lens) + 5
    k_cache = torch.randn(total, kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(total, kv_heads, head_dim, generator=g).to(dtype)
    perm = torch.randperm(total, generator=g)
    table = torch.zeros(len(reqs), max(lens) + 3, dtype=torch.int64)
    used = 0
    for i, s in enumerate(lens):
        table[i, :s] = perm[used : used + s]
        used += s
    q_start = torch.zeros(len(reqs) + 1, dtype=torch.int64)
    q_start[1:] = torch.tensor(n_new).cumsum(0)
    q = torch.randn(int(q_start[-1]), kv_heads * group, head_dim, generator=g).to(dtype)
    width = max(n_new) + extra_cols
    rows = []
    for i, n in enumerate(n_new):
        if i in TREES:
            parents = [-1] * (n - 1) if i == 6 else _random_parents(n - 1, g)
            m = ancestor_mask(parents)
        else:
            m = torch.ones(n, n, dtype=torch.bool).tril()
        rows.append(torch.nn.functional.pad(m, (0, width - n)))
    return q, k_cache, v_cache, q_start, torch.tensor(lens), table, torch.cat(rows), 1.0 / math.sqrt(head_dim)


@pytest.mark.parametrize("dtype", DT)
def test_matches_reference(kernel, dtype):
    q, k, v, qs, lens, table, mask = _batch(dtype)
    got = kernel(q, k, v, qs, lens, table, mask, D**-0.5)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, tree_attention_reference(q, k, v, qs, lens, table, mask, D**-0.5), **tol)


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("head_dim", [64, 80])
@pytest.mark.parametrize("kv_heads, group", [(2, 1), (3, 3), (1, 8)])
def test_mixed_batch_random_trees(kernel, tol, dtype, head_dim, kv_heads, group):
    # group 1: few rows a work item (the per-key dot products); 3 and 8: the blocked paths
    args = _mixed(kv_heads, group, head_dim, dtype, seed=head_dim + group)
    torch.testing.assert_close(kernel(*args), tree_attention_reference(*args), **tol(dtype))


@pytest.mark.parametrize("dtype", DT)
def test_lower_triangular_mask_is_paged_attention(kernel, impl, tol, dtype):
    q, k, v, qs, lens, table, _, scale = _mixed(2, 4, 64, dtype)
    n_new = (qs[1:] - qs[:-1]).tolist()
    causal = torch.ones(max(n_new), max(n_new), dtype=torch.bool).tril()
    mask = torch.cat([causal[:n] for n in n_new])
    got = kernel(q, k, v, qs, lens, table, mask, scale)
    if impl == "torch-native":
        torch.testing.assert_close(got, reference.paged_attention(q, k, v, qs, lens, table, scale), **tol(dtype))
    else:  # the same kernel, every step the causal one's
        idx = load_extension().variants.index(impl)
        assert torch.equal(got, torch.ops.anycore.paged_attention(q, k, v, qs, lens, table, scale, idx))


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("splits", [2, 5])
def test_split_k_decodes(impl, tol, dtype, splits):
    """Decode-only batches may run split-K; a row may see only the prefix (its own key hidden)."""
    if impl == "torch-native":
        pytest.skip("split-K is a native-kernel path")
    g = torch.Generator().manual_seed(splits)
    lens = torch.tensor([300, 97, 140])
    k = torch.randn(600, 2, 80, generator=g).to(dtype)
    v = torch.randn(600, 2, 80, generator=g).to(dtype)
    table = torch.randperm(600, generator=g)[:540].view(3, 180)
    table = torch.cat([table, torch.randperm(600, generator=g)[:3 * 120].view(3, 120)], dim=1)
    q = torch.randn(3, 8, 80, generator=g).to(dtype)
    qs = torch.arange(4)
    mask = torch.tensor([[True], [False], [True]])
    idx = load_extension().variants.index(impl)
    out = torch.ops.anycore.tree_attention(q, k, v, qs, lens, table, mask, 80**-0.5, idx, splits)
    torch.testing.assert_close(out, tree_attention_reference(q, k, v, qs, lens, table, mask, 80**-0.5),
                               **tol(dtype))


def test_native_when_falls_back():
    """The native kernel takes fp32/bf16 q, K, V of one dtype, head dims up to 512, GQA groups up
    to 64 and a 2-D bool mask; anything else runs the torch-native implementation."""
    when = spec(OP).native_when
    q, k, v, qs, lens, table, mask = _batch(torch.float32)
    assert when(q, k, v, qs, lens, table, mask, 0.25)
    assert when(q.bfloat16(), k.bfloat16(), v.bfloat16(), qs, lens, table, mask, 0.25)
    assert not when(q.half(), k.half(), v.half(), qs, lens, table, mask, 0.25)
    assert not when(q, k.bfloat16(), v.bfloat16(), qs, lens, table, mask, 0.25)
    assert not when(q, k, v, qs, lens, table, mask.to(torch.uint8), 0.25)
    big = torch.zeros(q.shape[0], 1, 520)
    assert not when(big, big, big, qs, lens, table, mask, 0.25)
    wide = torch.zeros(q.shape[0], 65, D)
    assert not when(wide, k[:, :1], v[:, :1], qs, lens, table, mask, 0.25)


def test_fp16_runs_torch_native(kernel):
    q, k, v, qs, lens, table, mask = _batch(torch.float16)
    torch.testing.assert_close(kernel(q, k, v, qs, lens, table, mask, D**-0.5),
                               tree_attention_reference(q, k, v, qs, lens, table, mask, D**-0.5),
                               atol=2e-3, rtol=2e-3)


def test_causal_mask_is_paged_attention():
    q, k, v, qs, lens, table, mask = _batch(torch.float32)
    causal = torch.ones(mask.shape[1], mask.shape[1], dtype=torch.bool).tril()
    mask = torch.cat([causal[: int(qs[i + 1] - qs[i])] for i in range(3)])
    torch.testing.assert_close(tree_attention_reference(q, k, v, qs, lens, table, mask, D**-0.5),
                               reference.paged_attention(q, k, v, qs, lens, table, D**-0.5))


def test_a_node_sees_exactly_its_path():
    q, k, v, qs, lens, table, mask = _batch(torch.float32)
    out = tree_attention_reference(q, k, v, qs, lens, table, mask, D**-0.5)
    prefix = int(lens[0]) - 8
    for j in range(len(PARENTS)):
        path = [j]
        while PARENTS[path[-1]] >= 0:
            path.append(PARENTS[path[-1]])
        cols = list(range(prefix + 1)) + [prefix + 1 + p for p in reversed(path)]  # prefix, root, path
        seq = table[0, cols][None]
        want = reference.paged_attention(q[j + 1 : j + 2], k, v, torch.tensor([0, 1]), torch.tensor([len(cols)]),
                                         seq, D**-0.5)
        torch.testing.assert_close(out[j + 1 : j + 2], want)
