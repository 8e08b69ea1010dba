"""Verification rules: greedy equals one-token argmax steps; rejection sampling preserves the
target distribution (empirical frequencies vs a chi-square bound, fixed seeds, no model)."""

from __future__ import annotations

import torch

from anycore.spec.verify import verify_greedy, verify_sampled

# chi-square 99.9% quantile for 3 degrees of freedom (a 4-token vocabulary)
CHI2_3DOF_999 = 16.27


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_greedy_accepts_the_agreeing_prefix_then_the_targets_token():
    assert verify_greedy([5, 6, 7], [5, 6]) == [5, 6, 7]  # all accepted + bonus
    assert verify_greedy([5, 9, 7], [5, 6]) == [5, 9]
    assert verify_greedy([4, 6, 7], [5, 6]) == [4]


P0 = torch.tensor([0.1, 0.2, 0.3, 0.4])  # the target's distribution of the first token
P1 = torch.tensor([0.5, 0.25, 0.15, 0.1])  # of the second, after the first draft token


def _first_tokens(draft_probs, draft_for, rule=verify_sampled, n=10000, seed=0):
    g = torch.Generator().manual_seed(seed)
    probs = torch.stack([P0, P1])
    first = torch.zeros(4)
    second_after_accept = torch.zeros(4)
    for _ in range(n):
        draft = draft_for(g)
        out = rule(probs, draft, g, draft_probs)
        first[out[0]] += 1
        if len(out) == 2:  # the draft was accepted (a correction never equals it), then the bonus
            assert out[0] == draft[0]
            second_after_accept[out[1]] += 1
        elif rule is verify_sampled:
            assert out[0] != draft[0]
    return first, second_after_accept


def test_point_mass_drafts_keep_the_target_distribution():
    # an n-gram draft is deterministic: always token 2 here
    first, second = _first_tokens(None, lambda g: [2])
    assert chi_square(first, P0) < CHI2_3DOF_999
    assert chi_square(second, P1) < CHI2_3DOF_999  # the bonus token after an accepted draft


def test_sampled_drafts_keep_the_target_distribution():
    q = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    first, second = _first_tokens(q, lambda g: [int(torch.multinomial(q[0], 1, generator=g))])
    assert chi_square(first, P0) < CHI2_3DOF_999
    assert chi_square(second, P1) < CHI2_3DOF_999


def test_the_bound_rejects_a_wrong_rule():
    """The same check catches a rule that resamples from p (not the residual) on rejection."""
    def naive(probs, draft, g, _q):
        if float(torch.rand((), generator=g)) < float(probs[0, draft[0]]):
            return [draft[0], int(torch.multinomial(probs[1], 1, generator=g))]
        return [int(torch.multinomial(probs[0], 1, generator=g))]

    first, _ = _first_tokens(None, lambda g: [2], rule=naive)
    assert chi_square(first, P0) > 10 * CHI2_3DOF_999


def test_a_seeded_generator_reproduces_the_tokens():
    probs = torch.stack([P0, P1, P0])
    runs = [[verify_sampled(probs, [3, 0], g) for _ in range(50)]
            for g in (torch.Generator().manual_seed(7), torch.Generator().manual_seed(7))]
    assert runs[0] == runs[1]
