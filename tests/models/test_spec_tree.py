"""Tree verification end to end on a tiny random checkpoint: trees whose right continuation
sits in a varying branch, cut at a varying depth, so every acceptance length occurs and the
accepted nodes' KV is never where the sequence order puts it; greedy output identical, no KV
slot leaked, the prefix cache consistent."""

from __future__ import annotations

import pytest

from anycore import LLM, SamplingParams
from anycore.scheduler.request import Request
from anycore.spec.policy import SpecState, SpeculativeConfig, Speculator
from anycore.spec.tree import DraftTree
from tests.models.test_speculative import GREEDY, PROMPTS, assert_no_slot_leaked
from tests.models.test_tiny_models import write_checkpoint


class OracleTrees(Speculator):
    """Per level: the known greedy token and a wrong sibling (which has a child of its own),
    in alternating order; the known token is spoiled at a varying level."""

    def __init__(self, reference: dict[tuple[int, ...], list[int]], depth: int = 3) -> None:
        super().__init__(SpeculativeConfig(num_tokens=depth))
        self.reference = reference
        self.calls = 0
        self.accepted: list[int] = []

    def propose(self, req: Request, limit: int, batch_size: int) -> list[int]:
        ref = self.reference.get(tuple(req.prompt_token_ids))
        if limit <= 0 or ref is None:
            return []
        self.calls += 1
        done = req.num_output_tokens
        right_path = ref[done : done + min(self.config.num_tokens, limit)]
        spoil = self.calls % (len(right_path) + 2)
        tokens: list[int] = []
        parents: list[int] = []
        parent = -1
        for level, right in enumerate(right_path):
            if level == spoil:
                right = (right + 1) % 256
            wrong = (right + 7) % 256
            order = [right, wrong] if (self.calls + level) % 2 else [wrong, right]
            for t in order:
                tokens.append(t)
                parents.append(parent)
            here = len(tokens) - 2 + order.index(right)
            wrong_node = len(tokens) - 2 + order.index(wrong)
            if level + 1 < len(right_path):
                tokens.append(3)  # (the wrong node's own child)
                parents.append(wrong_node)
            parent = here
        req.spec_state = req.spec_state or SpecState()
        return DraftTree(tokens, parents)

    def observe(self, req: Request, proposed: int, accepted: int) -> None:
        super().observe(req, proposed, accepted)
        self.accepted.append(accepted)


@pytest.fixture(scope="module", params=["llama-untied-llama3-rope", "qwen3-qk-norm"])
def models(request, tmp_path_factory, tokenizer):
    folder = tmp_path_factory.mktemp(request.param)
    write_checkpoint(folder, request.param, tokenizer)
    return (LLM(model=str(folder), dtype="float32", kv_cache_gb=0.01),
            LLM(model=str(folder), dtype="float32", kv_cache_gb=0.01, speculative_algorithm="ngram"))


def test_tree_drafts_give_identical_output_and_every_acceptance_length(models):
    base, spec = models
    expected = [o.token_ids for o in base.generate(PROMPTS, GREEDY)]
    oracle = OracleTrees({tuple(p): e for p, e in zip(PROMPTS, expected)})
    spec.engine.scheduler.speculator = oracle
    for prompt, want in zip(PROMPTS, expected):  # alone
        assert spec.generate([prompt], GREEDY)[0].token_ids == want
    assert [o.token_ids for o in spec.generate(PROMPTS, GREEDY)] == expected  # batched
    assert set(oracle.accepted) == {0, 1, 2, 3}
    assert_no_slot_leaked(spec)


def test_a_sampling_request_beside_tree_verifies(models):
    base, spec = models
    expected = [o.token_ids for o in base.generate(PROMPTS, GREEDY)]
    spec.engine.scheduler.speculator = OracleTrees({tuple(p): e for p, e in zip(PROMPTS[:2], expected[:2])})
    sampled = SamplingParams(temperature=0.8, seed=3, max_tokens=24, ignore_eos=True)
    want = base.generate([PROMPTS[3]], sampled)[0].token_ids
    outs = spec.generate(PROMPTS[:2] + [PROMPTS[3]], [GREEDY, GREEDY, sampled])
    assert [o.token_ids for o in outs[:2]] == expected[:2]
    assert outs[2].token_ids == want  # (no draft for it: sampled as usual, same seed, same tokens)
    assert_no_slot_leaked(spec)


def test_sampled_tree_verifies_take_every_acceptance_length(models):
    """Tree rejection sampling end to end: a sampler that can only pick the argmax (top_k=1)
    accepts the oracle's right branch wherever it sits, so every acceptance length occurs and the
    output is the greedy one; at temperature 0.8 a seeded request given the same trees gives the
    same tokens, and no KV slot is leaked."""
    base, spec = models
    expected = [o.token_ids for o in base.generate(PROMPTS, GREEDY)]
    reference = {tuple(p): e for p, e in zip(PROMPTS, expected)}
    oracle = OracleTrees(reference)
    spec.engine.scheduler.speculator = oracle
    argmax_only = SamplingParams(temperature=0.5, top_k=1, seed=2, max_tokens=24, ignore_eos=True)
    assert [o.token_ids for o in spec.generate(PROMPTS, argmax_only)] == expected
    assert set(oracle.accepted) == {0, 1, 2, 3}
    sampled = SamplingParams(temperature=0.8, seed=3, max_tokens=24, ignore_eos=True)
    runs = []
    for _ in range(2):  # (a fresh oracle each time: the same trees for the same tokens)
        spec.engine.scheduler.speculator = oracle = OracleTrees(reference)
        runs.append(spec.generate([PROMPTS[0]], sampled)[0].token_ids)
        assert oracle.calls > 0
    assert runs[0] == runs[1] and len(runs[0]) == 24
    assert_no_slot_leaked(spec)
