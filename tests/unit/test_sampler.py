"""Batched sampler: each knob does what its name says, per row, vectorised over the batch."""

from __future__ import annotations

import math

import pytest
import torch

from anycore.engine.sampler import SamplingBatch, sample
from anycore.sampling_params import SamplingParams
from anycore.scheduler.request import Request


def reqs(*params: SamplingParams, prompt=(1, 2, 3), outputs=()):
    out = []
    for i, p in enumerate(params):
        r = Request(f"r{i}", list(prompt), p, eos_token_ids=frozenset({0}))
        for t in outputs:
            r.append_token(t)
        if p.seed is not None:
            r.generator = torch.Generator().manual_seed(p.seed)
        out.append(r)
    return out


def draw(logits, rs):
    tokens, lps = sample(logits.clone(), SamplingBatch.from_requests(rs))
    return tokens.tolist(), lps


def test_greedy_is_argmax():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 0.0]])
    assert draw(logits, reqs(SamplingParams(temperature=0), SamplingParams(temperature=0)))[0] == [1, 0]


def test_top_k_one_is_greedy_even_with_temperature():
    logits = torch.randn(3, 50)
    tokens, _ = draw(logits, reqs(*[SamplingParams(temperature=2.0, top_k=1)] * 3))
    assert tokens == logits.argmax(-1).tolist()


def test_top_p_keeps_only_the_nucleus():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.05, 0.05]]))
    seen = set()
    for seed in range(200):
        seen.add(draw(logits, reqs(SamplingParams(temperature=1.0, top_p=0.8, seed=seed)))[0][0])
    assert seen == {0, 1}


def test_min_p_drops_unlikely_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.4, 0.06, 0.04]]))
    seen = {draw(logits, reqs(SamplingParams(temperature=1.0, min_p=0.2, seed=s)))[0][0] for s in range(200)}
    assert seen == {0, 1}


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2])
    logits = probs.log().repeat(4000, 1)
    tokens, _ = draw(logits, reqs(*[SamplingParams(temperature=1.0)] * 4000))
    freq = torch.bincount(torch.tensor(tokens), minlength=3).float() / 4000
    assert torch.allclose(freq, probs, atol=0.04)


def test_seed_reproducible_and_independent_of_batch():
    logits = torch.randn(1, 100)
    a = draw(logits, reqs(SamplingParams(temperature=1.0, seed=42)))[0]
    b = draw(logits.repeat(3, 1), reqs(SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, seed=42),
                                       SamplingParams(temperature=0.5)))[0]
    assert a[0] == b[1]
    runs = {tuple(draw(logits, reqs(SamplingParams(temperature=1.0, seed=7)))[0]) for _ in range(5)}
    assert len(runs) == 1


def test_repetition_penalty_pushes_seen_tokens_down():
    logits = torch.tensor([[2.0, 1.9, 0.0, -1.0]])
    # token 0 was seen in the prompt: 2.0 / 1.5 < 1.9
    assert draw(logits, reqs(SamplingParams(temperature=0, repetition_penalty=1.5), prompt=(0,)))[0] == [1]


def test_frequency_and_presence_penalties():
    logits = torch.tensor([[2.0, 1.5, 0.0, 0.0]])
    r = reqs(SamplingParams(temperature=0, frequency_penalty=0.3), outputs=(0, 0))
    assert draw(logits, r)[0] == [1]  # 2.0 - 2*0.3 = 1.4 < 1.5
    r = reqs(SamplingParams(temperature=0, presence_penalty=0.6), outputs=(0,))
    assert draw(logits, r)[0] == [1]  # 2.0 - 0.6 < 1.5


def test_min_tokens_bans_eos():
    logits = torch.tensor([[9.0, 1.0, 0.0]])  # eos (0) would win
    assert draw(logits, reqs(SamplingParams(temperature=0, min_tokens=2, max_tokens=5)))[0] == [1]


def test_logprobs_of_raw_distribution_with_top_n():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5]])
    tokens, lps = draw(logits, reqs(SamplingParams(temperature=0, logprobs=2)))
    ref = logits.log_softmax(-1)[0]
    assert lps[0].token_id == 2 and math.isclose(lps[0].logprob, ref[2].item(), rel_tol=1e-6)
    assert [t for t, _ in lps[0].top] == [2, 1]


def test_mixed_batch_rows_do_not_interfere():
    logits = torch.tensor([[0.0, 5.0, 0.0], [0.0, 0.0, 5.0]])
    tokens, lps = draw(logits, reqs(SamplingParams(temperature=0, logprobs=1), SamplingParams(temperature=0.7, top_k=1)))
    assert tokens == [1, 2] and lps[1] is None


@pytest.mark.parametrize("kwargs", [
    {"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}, {"top_k": -2}, {"min_p": 2},
    {"max_tokens": -1}, {"n": 0}, {"repetition_penalty": 0}, {"frequency_penalty": 3},
    {"presence_penalty": -3}, {"logprobs": 50}, {"prompt_logprobs": 21},
    {"prompt_logprobs": -1}, {"stop": [""]},
])
def test_invalid_params_raise_clear_errors(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_argmax_rows_matches_torch_argmax_first_index_on_ties():
    from anycore.engine.sampler import argmax_rows

    torch.manual_seed(0)
    x = torch.randn(5, 49152)
    x[1, 7] = x[1, 9000] = x[1].max() + 1  # a tie: the first index wins, as in torch
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1)) and argmax_rows(x).dtype == torch.int64
    assert torch.equal(argmax_rows(x[:, ::2]), x[:, ::2].argmax(dim=-1))  # strided rows
    assert torch.equal(argmax_rows(x.bfloat16()), x.bfloat16().argmax(dim=-1))  # other dtypes: torch's


@pytest.mark.parametrize("params, outputs", [
    (SamplingParams(temperature=0), ()),  # plain greedy: the argmax shortcut
    (SamplingParams(temperature=0, logprobs=2), ()),
    (SamplingParams(temperature=0, repetition_penalty=1.5), ()),
    (SamplingParams(temperature=0, presence_penalty=1.0), (3,)),
    (SamplingParams(temperature=0, min_tokens=4), (5,)),  # EOS (id 0) still banned
    (SamplingParams(temperature=0.8, seed=1), ()),
])
def test_sample_requests_equals_sample(params, outputs):
    """The plain-greedy shortcut and the full path agree on tokens and logprobs, whatever the knobs."""
    from anycore.engine.sampler import sample_requests

    torch.manual_seed(0)
    logits = torch.randn(3, 40)
    logits[:, 0] = 10.0  # EOS would win unless banned
    logits[:, 3] = 9.0  # then the penalised token
    got = sample_requests(logits.clone(), reqs(*[params] * 3, outputs=outputs))
    want = sample(logits.clone(), SamplingBatch.from_requests(reqs(*[params] * 3, outputs=outputs)))
    assert got[0].tolist() == want[0].tolist() and got[1] == want[1]
