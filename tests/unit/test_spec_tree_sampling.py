"""Tree rejection sampling (anycore/spec/tree.py ``verify_tree_sampled``): on a fixed tree over
a 6-token vocabulary (three branches at the root, depth 3, a child of zero probability, a point
mass leaf) the emitted tokens follow the exact distribution of one-token sampling steps: the
first token, the joint of the first two and whole outputs against chi-square bounds, with wrong
rules (no renormalisation after a rejected sibling, a redraw from the full row) as negative
controls that the same bounds must reject; the accepted path matches the tokens; a seeded
generator reproduces the tokens. No model."""

from __future__ import annotations

import math

import pytest
import torch

from anycore.spec.tree import DraftTree, path_of, verify_tree_sampled
from anycore.spec.verify import draw_weighted

V = 6
# node:      0  1  2  3  4  5  6  7  8  9
TOKENS = [2, 0, 4, 1, 2, 3, 5, 0, 1, 4]
PARENTS = [-1, -1, -1, 0, 0, 1, 3, 3, 5, 1]
TREE = DraftTree(TOKENS, PARENTS)
# row 0: the root's distribution, row j + 1: node j's (the target after the root and node j's path)
ROWS = torch.tensor([
    [0.20, 0.05, 0.30, 0.10, 0.25, 0.10],  # root: children 2, 0, 4 tried in that order
    [0.10, 0.35, 0.25, 0.00, 0.15, 0.15],  # node 0 (2): children 1, 2
    [0.30, 0.10, 0.10, 0.40, 0.00, 0.10],  # node 1 (0): children 3 and 4, which has p = 0
    [0.10, 0.20, 0.30, 0.40, 0.00, 0.00],  # node 2 (4): a leaf
    [0.25, 0.10, 0.20, 0.00, 0.05, 0.40],  # node 3 (2, 1): children 5, 0
    [1 / 6] * 6,                           # node 4 (2, 2): a leaf
    [0.00, 0.50, 0.20, 0.10, 0.10, 0.10],  # node 5 (0, 3): child 1
    [0.50, 0.50, 0.00, 0.00, 0.00, 0.00],  # node 6 (2, 1, 5): a leaf
    [0.00, 0.00, 0.00, 0.00, 0.00, 1.00],  # node 7 (2, 1, 0): a point mass leaf
    [0.20, 0.20, 0.20, 0.20, 0.20, 0.00],  # node 8 (0, 3, 1): a leaf
    [0.00, 0.00, 0.00, 0.00, 0.00, 1.00],  # node 9 (0, 4): never reached
], dtype=torch.float64)  # (float64 so the exact outputs' masses sum to 1 to ~1e-15)
N = 30000
STOP = -1  # "no second token" in the joint of the first two


def exact_outputs() -> dict[tuple[int, ...], float]:
    """The probability of every output one-token sampling steps give, walking the tree: a
    token that is a child's continues from that child's row, any other ends the output (the
    correction), and a leaf's row gives the bonus token."""
    child = {(p, TOKENS[j]): j for j, p in enumerate(PARENTS)}
    out: dict[tuple[int, ...], float] = {}

    def walk(node: int, prefix: tuple[int, ...], mass: float) -> None:
        for x, p in enumerate(ROWS[node + 1].tolist()):
            if p == 0.0:
                continue
            nxt = child.get((node, x))
            if nxt is None:
                out[prefix + (x,)] = mass * p
            else:
                walk(nxt, prefix + (x,), mass * p)

    walk(-1, (), 1.0)
    return out


def chi2_bound(dof: int, z: float = 3.0902) -> float:
    """The 99.9% quantile of chi-square with ``dof`` degrees of freedom (Wilson-Hilferty: within
    0.3 of the exact value for dof >= 3)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi_square(counts: dict, exact: dict[object, float], n: int) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom; cells expecting fewer than 5 are pooled, and
    an observed cell the exact distribution gives no mass counts as infinitely unlikely."""
    if any(k not in exact for k in counts):
        return math.inf, 1
    cells = [(n * p, counts.get(k, 0)) for k, p in exact.items()]
    big = [c for c in cells if c[0] >= 5]
    small = [c for c in cells if c[0] < 5]
    if small:
        big.append((sum(e for e, _ in small), sum(o for _, o in small)))
    return sum((o - e) ** 2 / e for e, o in big), len(big) - 1


def marginals(exact: dict[tuple[int, ...], float]) -> tuple[dict, dict]:
    first: dict[int, float] = {}
    two: dict[tuple[int, int], float] = {}
    for seq, p in exact.items():
        first[seq[0]] = first.get(seq[0], 0.0) + p
        key = (seq[0], seq[1] if len(seq) > 1 else STOP)
        two[key] = two.get(key, 0.0) + p
    return first, two


def sample(rule, n: int = N, seed: int = 0) -> dict[tuple[int, ...], int]:
    g = torch.Generator().manual_seed(seed)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(n):
        tokens, path = rule(ROWS, TREE, g)
        if rule is verify_tree_sampled:  # the path is the accepted tokens' nodes, root to leaf
            assert [TOKENS[j] for j in path] == tokens[:-1]
            assert path == path_of(TREE, tokens[:-1])
        counts[tuple(tokens)] = counts.get(tuple(tokens), 0) + 1
    return counts


def no_renormalisation(probs, tree, g):
    """Wrong: each child is accepted with its probability in the unchanged row, not in the row
    with the rejected siblings removed (so later siblings are under-drawn)."""
    return _wrong(probs, tree, g, renormalise=False)


def redraw_from_full_row(probs, tree, g):
    """Wrong: after every child is rejected, the token is drawn from the whole row (the rejected
    children may come back), not from the residual."""
    return _wrong(probs, tree, g, residual=False)


def _wrong(probs, tree, g, renormalise=True, residual=True):
    node, out, path = -1, [], []
    while True:
        row = probs[node + 1]
        kids = [j for j, p in enumerate(tree.parents) if p == node]
        left, accepted = 1.0, None
        for c in kids:
            p_c = float(row[tree[c]])
            if p_c > 0 and float(torch.rand((), dtype=torch.float64, generator=g)) * left < p_c:
                accepted = c
                break
            if renormalise:
                left -= p_c
        if accepted is None:
            rest = row.clone()
            if residual and kids:
                rest[[tree[c] for c in kids]] = 0.0
            out.append(draw_weighted(rest, g))
            return out, path
        out.append(tree[accepted])
        path.append(accepted)
        node = accepted


@pytest.fixture(scope="module")
def exact():
    e = exact_outputs()
    assert abs(sum(e.values()) - 1.0) < 1e-9
    return e


@pytest.fixture(scope="module")
def counts():
    return sample(verify_tree_sampled)


def test_tree_rejection_sampling_keeps_the_target_distribution(exact, counts):
    first, two = marginals(exact)
    got_first, got_two = marginals({k: float(v) for k, v in counts.items()})
    for observed, want in ((got_first, first), (got_two, two), (counts, exact)):
        stat, dof = chi_square(observed, want, N)
        assert dof >= 5
        assert stat < chi2_bound(dof), (stat, dof)
    # every depth is reached, and the zero-probability child (node 9, token 4 after 0) never is
    assert max(len(k) for k in counts) == TREE.max_depth + 1
    assert not any(k[:2] == (0, 4) for k in counts)


@pytest.mark.parametrize("rule", [no_renormalisation, redraw_from_full_row])
def test_the_bounds_reject_a_wrong_rule(exact, rule):
    """Negative controls: each wrong rule fails the same checks, by a wide margin."""
    first, two = marginals(exact)
    counts = sample(rule)
    got_first, got_two = marginals({k: float(v) for k, v in counts.items()})
    stat_first, dof_first = chi_square(got_first, first, N)
    stat_two, dof_two = chi_square(got_two, two, N)
    assert stat_first > 10 * chi2_bound(dof_first) or stat_two > 10 * chi2_bound(dof_two)


def test_a_seeded_generator_reproduces_the_tokens():
    runs = [[verify_tree_sampled(ROWS, TREE, g) for _ in range(200)]
            for g in (torch.Generator().manual_seed(7), torch.Generator().manual_seed(7))]
    assert runs[0] == runs[1]
    other = torch.Generator().manual_seed(8)
    assert [verify_tree_sampled(ROWS, TREE, other) for _ in range(200)] != runs[0]


def test_a_chain_and_a_bare_root():
    """A one-branch tree is a chain; a node whose only child token has all the mass is always
    accepted; a tree of zero nodes draws the root's token."""
    chain = DraftTree([5, 0], [-1, 0])
    rows = torch.zeros(3, V)
    rows[0, 5] = 1.0
    rows[1, 0] = 1.0
    rows[2, 3] = 1.0
    g = torch.Generator().manual_seed(0)
    assert verify_tree_sampled(rows, chain, g) == ([5, 0, 3], [0, 1])
    assert verify_tree_sampled(rows[:1], DraftTree([], []), g) == ([5], [])
    rows[0] = torch.tensor([0.0, 0.0, 0.5, 0.0, 0.0, 0.5])  # the child (5) rejected: token 2
    tokens = {tuple(verify_tree_sampled(rows, chain, g)[0]) for _ in range(50)}
    assert tokens == {(2,), (5, 0, 3)}
