"""Tree drafts: several candidate continuations verified in one extend.

A ``DraftTree`` is a list of draft tokens in tree order (every parent before its children) with
each token's parent (-1: a child of the root, which is the request's last token). The verify
extend computes the root and every node; node j sits at position start + depth(j) and attends to
the prefix, the root and its own ancestors only (``ancestor_mask``, the ``tree_attention`` op).

Greedy verification walks from the root: while the target's argmax at the current node is the
token of one of its children, that child is accepted; the argmax at the last accepted node is
emitted too (the correction, or the bonus token at a leaf). The emitted tokens are what one-token
greedy steps give, so the output is identical. Siblings carry distinct tokens, so the accepted
path is determined by the emitted tokens.

Sampled verification (``verify_tree_sampled``) is recursive rejection sampling with point-mass
proposals (the children are fixed tokens, not draws): at the current node, with the target's
processed distribution p there, its children are tried in tree order; child c is accepted with
probability p(c) under the current p, and on a rejection p(c) is set to 0 and p renormalised
before the next child. Lossless: with the children's distinct tokens t1, t2, ..., the first is
emitted with probability p(t1); given t1 was rejected, p restricted to the other tokens and
renormalised is exactly the target's distribution conditioned on "not t1", so t2 is emitted
with probability (1 - p(t1)) * p(t2) / (1 - p(t1)) = p(t2), and so on; once every child is
rejected the draw from what is left (the residual) gives every other token x probability
(1 - sum p(t_i)) * p(x) / (1 - sum p(t_i)) = p(x). So each emitted token is distributed as p at
its node, and a node's row was computed with the prefix and its ancestors as context (the
tokens emitted before), so the emitted sequence is distributed as one-token sampling steps. An
accepted child's row is then used the same way (its children, or at a leaf the bonus token
drawn from its row). Siblings' tokens differ, so again the path follows from the tokens.

KV: the accepted nodes' slots already hold their K/V computed at the right positions with the
right context (the prefix and their ancestors, which is the accepted sequence), so keeping them
is a reordering of the request's slot list (``accept_path``): no copy. The other nodes' slots go
back to the pool with the rest of the rejected positions.
"""

from __future__ import annotations

import torch

from anycore.spec.verify import draw_weighted


class DraftTree(list):
    """Draft tokens (the list itself) with ``parents``; a chain is the tree whose parents are j - 1."""

    def __init__(self, tokens: list[int], parents: list[int]) -> None:
        super().__init__(tokens)
        if len(parents) != len(tokens):
            raise ValueError("a draft tree needs one parent per token")
        seen: set[tuple[int, int]] = set()
        for j, p in enumerate(parents):
            if not -1 <= p < j:
                raise ValueError("a draft tree lists every parent before its children")
            if (p, tokens[j]) in seen:
                raise ValueError("sibling draft tokens must differ")
            seen.add((p, tokens[j]))
        self.parents = list(parents)
        self.depths: list[int] = []
        for p in parents:
            self.depths.append(1 if p < 0 else self.depths[p] + 1)

    @property
    def max_depth(self) -> int:
        return max(self.depths, default=0)

    def truncate(self, n: int) -> DraftTree:
        """The first ``n`` nodes (still a tree: parents come first)."""
        return DraftTree(list(self[:n]), self.parents[:n])


def ancestor_mask(parents: list[int], with_root: bool = True) -> torch.Tensor:
    """[rows, rows] bool. With the root: row 0 is the root (sees itself), row j + 1 node j (the
    root, its ancestors and itself). Without: row j is node j (its ancestors and itself)."""
    off = 1 if with_root else 0
    n = len(parents) + off
    m = torch.zeros(n, n, dtype=torch.bool)
    if with_root:
        m[:, 0] = True
    for j in range(len(parents)):
        m[j + off, j + off] = True
        p = parents[j]
        while p >= 0:
            m[j + off, p + off] = True
            p = parents[p]
    return m


def verify_tree_greedy(target_argmax: list[int], tree: DraftTree) -> tuple[list[int], list[int]]:
    """``target_argmax``: 1 + len(tree) tokens, row 0 the root's, row j + 1 node j's. Returns the
    emitted tokens (1 .. max_depth + 1) and the accepted nodes, root to leaf."""
    children: dict[int, dict[int, int]] = {}
    for j, p in enumerate(tree.parents):
        children.setdefault(p, {})[tree[j]] = j
    out: list[int] = []
    path: list[int] = []
    node = -1
    while True:
        t = target_argmax[node + 1]
        out.append(t)
        nxt = children.get(node, {}).get(t)
        if nxt is None:
            return out, path
        path.append(nxt)
        node = nxt


def verify_tree_sampled(probs: torch.Tensor, tree: DraftTree,
                        generator: torch.Generator | None) -> tuple[list[int], list[int]]:
    """``probs``: ``[1 + len(tree), V]`` target probabilities (after bias, temperature and
    filters), row 0 the root's, row j + 1 node j's. Returns the emitted tokens (1 .. max_depth +
    1) and the accepted nodes, root to leaf, like ``verify_tree_greedy``.

    Random numbers come from ``generator`` (a seeded request's own) in a fixed order: at each
    visited node one uniform per child (drawn together, used in tree order), then one draw from
    the residual or, at a leaf, from the leaf's row. So a seeded request given the same tree and
    rows emits the same tokens.

    Only the children's probabilities are read as numbers: the residual's mass is the row's
    total less the rejected children's, so "accept c with probability p(c) / (mass left)" needs
    no renormalised copy of the row; one is made only for the final draw."""
    children: dict[int, list[int]] = {}
    for j, p in enumerate(tree.parents):
        children.setdefault(p, []).append(j)
    out: list[int] = []
    path: list[int] = []
    node = -1
    while True:
        row = probs[node + 1]
        kids = children.get(node, [])
        if not kids:  # a leaf (or a root without children): the bonus token from its row
            out.append(draw_weighted(row, generator))
            return out, path
        tokens = [tree[c] for c in kids]
        p_kids = row[tokens].double().tolist()
        uniforms = torch.rand(len(kids), dtype=torch.float64, generator=generator).tolist()
        left = float(row.sum(dtype=torch.float64))  # the unnormalised mass not yet rejected
        accepted = None
        for c, p_c, u in zip(kids, p_kids, uniforms):
            # u < p(c) / left without dividing; p(c) > 0 so a filtered-out token is never taken
            # (rounding may leave ``left`` a hair off, even <= 0 when only c had mass: take it)
            if p_c > 0.0 and u * left < p_c:
                accepted = c
                break
            left -= p_c  # p(c) = 0 from now on: the next child is tried under the renormalised rest
        if accepted is None:  # every child rejected: draw from the residual
            residual = row.clone()
            residual[tokens] = 0.0
            out.append(draw_weighted(residual, generator))
            return out, path
        out.append(tree[accepted])
        path.append(accepted)
        node = accepted


def path_of(tree: DraftTree, tokens: list[int]) -> list[int]:
    """The nodes the accepted draft ``tokens`` (root to leaf) are."""
    path: list[int] = []
    node = -1
    for t in tokens:
        node = next(j for j, p in enumerate(tree.parents) if p == node and tree[j] == t)
        path.append(node)
    return path


def accept_path(slots: list[int], start: int, path: list[int]) -> list[int]:
    """The slot list with the accepted nodes' slots moved into sequence order right after the
    root (position ``start``); the rejected nodes' follow, to be rolled back."""
    nodes = slots[start + 1 :]
    chosen = set(path)
    return slots[: start + 1] + [nodes[j] for j in path] + [s for j, s in enumerate(nodes) if j not in chosen]
