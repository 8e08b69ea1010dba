"""tree_attention: every implementation against the reference; a lower-triangular mask is causal
paged attention; a tree node's output equals causal attention over the prefix and its own
root-to-node path laid out as a plain sequence."""

from __future__ import annotations

import pytest
import torch

from anycore.kernels import reference
from anycore.kernels.dispatch import implementations, make_op
from anycore.kernels.tree_attention import tree_attention_reference

H, KV, D = 4, 2, 16
DT = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
PARENTS = [-1, -1, 0, 0, 1, 2, 5]  # nodes 0..6 after the root; -1: a child of the root


def _impls():
    return [pytest.param(name, id=name) for name, why in implementations("tree_attention") if not why]


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """[1 + n, 1 + n]: the root (row 0) sees itself; node j (row j + 1) the root, its ancestors, itself."""
    n = len(parents)
    m = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    m[:, 0] = True
    for j in range(n):
        m[j + 1, j + 1] = True
        p = parents[j]
        while p >= 0:
            m[j + 1, p + 1] = True
            p = parents[p]
    return m


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


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("name", _impls())
def test_matches_reference(name, dtype):
    q, k, v, qs, lens, table, mask = _batch(dtype)
    got = make_op("tree_attention", name)(q, k, v, qs, lens, table, mask, D**-0.5)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, tree_attention_reference(q, k, v, qs, lens, table, mask, D**-0.5), **tol)


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
