"""The sampler's constraints over a batch, with a tiny vocabulary and no model: the grammar
bitmask (rows with and without a grammar in one batch) and logit_bias; and that constrained
requests never take the multi-step greedy decode, which skips the sampler."""

from __future__ import annotations

import torch

from anycore.engine.grammar import bitmask_words
from anycore.engine.sampler import sample_requests
from anycore.sampling_params import SamplingParams
from anycore.scheduler.request import Request

V = 70  # > 64: the bitmask spans three 32-bit words


class FixedGrammar:
    """A matcher stand-in allowing a fixed set of tokens."""

    def __init__(self, allowed: list[int]) -> None:
        self.allowed = allowed
        self.vocab_size = V

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row] = 0
        for t in self.allowed:
            word, bit = divmod(t, 32)
            value = int(bitmask[row, word]) & 0xFFFFFFFF | (1 << bit)
            bitmask[row, word] = value - (1 << 32) if value >= 1 << 31 else value


def req(params: SamplingParams, grammar=None, i: int = 0) -> Request:
    r = Request(f"r{i}", [1, 2], params, eos_token_ids=frozenset({0}))
    r.grammar = grammar
    if params.seed is not None:
        r.generator = torch.Generator().manual_seed(params.seed)
    return r


def test_rows_with_and_without_a_grammar_share_a_batch():
    assert bitmask_words(V) == 3
    logits = torch.zeros(3, V)
    logits[:, 5] = 10.0  # every row's favourite
    reqs = [req(SamplingParams(temperature=0), FixedGrammar([33, 66]), 0),
            req(SamplingParams(temperature=0), None, 1),
            req(SamplingParams(temperature=1.0, seed=3), FixedGrammar([31, 63]), 2)]
    logits[0, 66] = 1.0
    tokens, _ = sample_requests(logits, reqs)
    assert tokens.tolist()[:2] == [66, 5]
    assert tokens.tolist()[2] in (31, 63)  # the sign bit of a word (bit 31) counts as allowed


def test_sampled_rows_stay_inside_the_grammar():
    logits = torch.randn(200, V)
    reqs = [req(SamplingParams(temperature=1.5, seed=s), FixedGrammar([2, 40, 69]), s) for s in range(200)]
    tokens, _ = sample_requests(logits, reqs)
    assert set(tokens.tolist()) <= {2, 40, 69}
    assert len(set(tokens.tolist())) > 1


def test_logit_bias_forces_and_bans_per_row():
    logits = torch.zeros(3, V)
    logits[:, 7] = 5.0
    reqs = [req(SamplingParams(temperature=0, logit_bias={12: 100}), None, 0),
            req(SamplingParams(temperature=0, logit_bias={7: -100}), None, 1),
            req(SamplingParams(temperature=0), None, 2)]
    logits[1, 9] = 1.0
    tokens, _ = sample_requests(logits, reqs)
    assert tokens.tolist() == [12, 9, 7]


def test_logit_bias_does_not_move_the_reported_logprobs():
    logits = torch.log_softmax(torch.randn(1, V), -1)
    r = req(SamplingParams(temperature=0, logprobs=1, logit_bias={3: 100}))
    tokens, lps = sample_requests(logits.clone(), [r])
    assert tokens.tolist() == [3]
    assert abs(lps[0].logprob - logits[0, 3].item()) < 1e-5  # the model's distribution, as vLLM reports


def test_constrained_requests_are_not_plain_greedy():
    assert req(SamplingParams(temperature=0)).plain_greedy
    assert not req(SamplingParams(temperature=0, logit_bias={1: 1.0})).plain_greedy
    assert not req(SamplingParams(temperature=0), FixedGrammar([1])).plain_greedy


class EndsAfter:
    """A matcher stand-in at its end after ``n`` accepted tokens."""

    def __init__(self, n: int) -> None:
        self.n, self.accepted = n, []

    def accept(self, token: int) -> bool:
        self.accepted.append(token)
        return True

    @property
    def at_end(self) -> bool:
        return len(self.accepted) >= self.n


def test_a_grammar_at_its_end_finishes_the_request_with_stop():
    r = req(SamplingParams(temperature=0, max_tokens=10), EndsAfter(2))
    r.append_token(4)
    assert r.check_stop() is None
    r.append_token(5)
    assert r.check_stop() == "stop"
    assert r.grammar.accepted == [4, 5]
