"""Tree drafts: greedy tree verification against the chain verifier over every root-to-leaf
path, the accepted nodes' slots moved into sequence order, and malformed trees refused."""

from __future__ import annotations

import random

import pytest

from anycore.spec.tree import DraftTree, accept_path, ancestor_mask, path_of, verify_tree_greedy
from anycore.spec.verify import verify_greedy


def random_tree(rng: random.Random, n: int, vocab: int) -> DraftTree:
    tokens: list[int] = []
    parents: list[int] = []
    for j in range(n):
        while True:  # a parent with a token left for one more child
            p = rng.randrange(-1, j)
            used = {tokens[i] for i in range(j) if parents[i] == p}
            if len(used) < vocab:
                break
        tokens.append(rng.choice([t for t in range(vocab) if t not in used]))
        parents.append(p)
    return DraftTree(tokens, parents)


def reference(argmax: list[int], tree: DraftTree) -> list[int]:
    """The longest output any root-to-node path gives under chain verification."""
    best: list[int] = [argmax[0]]
    for j in range(len(tree)):
        path = [j]
        while tree.parents[path[-1]] >= 0:
            path.append(tree.parents[path[-1]])
        path.reverse()
        out = verify_greedy([argmax[0]] + [argmax[p + 1] for p in path], [tree[p] for p in path])
        if len(out) > len(best):
            best = out
    return best


@pytest.mark.parametrize("seed", range(100))
def test_greedy_tree_verify_is_the_best_chain(seed):
    rng = random.Random(seed)
    tree = random_tree(rng, rng.randrange(1, 12), 4)
    # argmax rows biased towards the drafted tokens so long acceptances occur
    argmax = [rng.choice([*tree, rng.randrange(4)]) for _ in range(len(tree) + 1)]
    tokens, path = verify_tree_greedy(argmax, tree)
    assert tokens == reference(argmax, tree)
    assert [tree[j] for j in path] == tokens[:-1]
    assert path_of(tree, tokens[:-1]) == path
    assert len(path) <= tree.max_depth
    for a, b in zip(path, path[1:]):
        assert tree.parents[b] == a


def test_accept_path_moves_the_accepted_slots_after_the_root():
    slots = [10, 11, 12, 20, 21, 22, 23, 24]  # prefix 10 11, root 12 at position 2, nodes 0..4
    assert accept_path(slots, 2, [1, 4]) == [10, 11, 12, 21, 24, 20, 22, 23]
    assert accept_path(slots, 2, []) == slots


def test_ancestor_mask_and_depths():
    tree = DraftTree([5, 6, 7, 8], [-1, -1, 0, 2])
    assert tree.depths == [1, 1, 2, 3] and tree.max_depth == 3
    m = ancestor_mask(tree.parents)
    assert m[4].tolist() == [True, True, False, True, True]  # node 3: root, 0, 2, itself
    assert m[2].tolist() == [True, False, True, False, False]
    assert ancestor_mask(tree.parents, with_root=False)[3].tolist() == [True, False, True, True]
    assert tree.truncate(2) == [5, 6] and tree.truncate(2).parents == [-1, -1]


def test_malformed_trees_are_refused():
    with pytest.raises(ValueError, match="parent"):
        DraftTree([1, 2], [-1, 1])
    with pytest.raises(ValueError, match="differ"):
        DraftTree([1, 1], [-1, -1])
