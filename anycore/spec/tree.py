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

KV: the accepted nodes' slots already hold their K/V computed at the right positions with the
right context (the prefix and their ancestors, which is the accepted sequence), so keeping them
is a reordering of the request's slot list (``accept_path``): no copy. The other nodes' slots go
back to the pool with the rest of the rejected positions.
"""

from __future__ import annotations

import torch


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
