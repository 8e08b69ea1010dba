"""EAGLE and EAGLE-3 heads on random-weight checkpoints written here: the drafts equal a plain
whole-sequence reference of the head over transformers' hidden states (so the layouts, the
feature pairing and the head's KV are right), and greedy output is identical with and without
speculation, alone and batched, with no KV slot of either pool leaked. Top-k trees: greedy
output identical; sampled requests verify trees by rejection sampling, seeded output the same
run to run, and a sampler that can only pick the argmax (tiny temperature, top_k=1) gives the
greedy output."""

from __future__ import annotations

import pytest

from anycore import LLM, SamplingParams
from anycore.spec.tree import DraftTree
from tests.models.eagle_checkpoints import (
    assert_chunked_prefill_and_prefix_hits_identical,
    reference_drafts,
    write_eagle,
    write_target,
)
from tests.models.test_speculative import PROMPTS, assert_no_slot_leaked

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
# kind, target layers, EAGLE-3 layer ids in the head's config (None: the default 2, L/2, L-3)
CASES = {"eagle": ("eagle", 2, None), "eagle3-default-layers": ("eagle3", 4, None),
         "eagle3-config-layers": ("eagle3", 2, [0, 1, -1])}
TREE = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module", params=sorted(CASES))
def setup(request, tmp_path_factory, tokenizer):
    kind, layers, ids = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    hf = write_target(root / "target", tokenizer, layers)
    tensors = write_eagle(root / "head", kind, ids)
    base = LLM(model=str(root / "target"), dtype="float32", kv_cache_gb=0.01)
    spec = LLM(model=str(root / "target"), dtype="float32", kv_cache_gb=0.01, speculative_algorithm=kind,
               speculative_model=str(root / "head"), num_speculative_tokens=3, speculative_min_acceptance=0.0)
    return kind, hf, tensors, base, spec


def test_drafts_match_the_reference_head(setup):
    kind, hf, tensors, _, spec = setup
    speculator = spec.engine.speculator
    seen: list[tuple[list[int], list[int]]] = []
    original = speculator.propose

    def spy(req, limit, batch_size):
        draft = original(req, limit, batch_size)
        if draft:
            seen.append((list(req.all_token_ids), draft))
        return draft

    speculator.propose = spy
    try:
        spec.generate([PROMPTS[0], PROMPTS[2]], GREEDY)
    finally:
        del speculator.propose
    assert len(seen) >= 4
    for tokens, draft in seen[:6]:
        want = reference_drafts(kind, tensors, hf, tokens, len(draft), speculator.capture_layers)
        assert draft == want


def test_greedy_output_is_identical(setup):
    _, _, _, base, spec = setup
    expected = [o.token_ids for o in base.generate(PROMPTS, GREEDY)]
    for prompt, want in zip(PROMPTS, expected):  # alone
        assert spec.generate([prompt], GREEDY)[0].token_ids == want
    assert [o.token_ids for o in spec.generate(PROMPTS, GREEDY)] == expected  # batched
    stats = spec.engine.stats()
    assert stats.spec_verify_steps > 0 and stats.spec_draft_tokens > 0
    assert_no_slot_leaked(spec)
    assert spec.engine.speculator.num_slots_held == 0  # the head's KV given back too


def test_chunked_prefill_and_prefix_hits_keep_output_identical(setup):
    """Features arrive chunk by chunk; a prefix-cache hit leaves positions without features."""
    _, _, _, base, spec = setup
    assert_chunked_prefill_and_prefix_hits_identical(base, spec, PROMPTS, GREEDY)
    assert_no_slot_leaked(spec)
    assert spec.engine.speculator.num_slots_held == 0


def test_bad_settings_are_refused(tmp_path, tokenizer):
    from anycore.spec.policy import SpeculativeConfig

    with pytest.raises(ValueError, match="needs speculative_model"):
        SpeculativeConfig(algorithm="eagle3")
    write_target(tmp_path / "target", tokenizer, 2)
    write_eagle(tmp_path / "head", "eagle3")  # default layers 2, 1, -1: not in a 2-layer target
    with pytest.raises(ValueError, match="three target layers"):
        LLM(model=str(tmp_path / "target"), dtype="float32", kv_cache_gb=0.01, speculative_algorithm="eagle3",
            speculative_model=str(tmp_path / "head"))


def test_tree_drafts_keep_greedy_output_identical(setup):
    """Top-k trees from the head (k = 2 for EAGLE, 3 for EAGLE-3), verified with tree
    attention; the rejected branches' slots are freed, the accepted path's features feed the head."""
    kind, _, _, base, spec = setup
    topk = 2 if kind == "eagle" else 3
    tree = _tree_llm(spec, kind, topk)
    expected = [o.token_ids for o in base.generate(PROMPTS, TREE)]
    for prompt, want in zip(PROMPTS[:2], expected):  # alone
        assert tree.generate([prompt], TREE)[0].token_ids == want
    assert [o.token_ids for o in tree.generate(PROMPTS, TREE)] == expected  # batched
    stats = tree.engine.stats()
    assert stats.spec_verify_steps > 0
    assert_no_slot_leaked(tree)
    assert tree.engine.speculator.num_slots_held == 0


def _tree_llm(spec: LLM, kind: str, topk: int) -> LLM:
    return LLM(model=spec.engine.config.model, dtype="float32", kv_cache_gb=0.01, speculative_algorithm=kind,
               speculative_model=spec.engine.config.speculative_model, num_speculative_tokens=3,
               speculative_eagle_topk=topk, speculative_min_acceptance=0.0)


def test_sampled_requests_verify_tree_drafts(setup):
    """Sampled requests get top-k trees (tree rejection sampling): seeded output identical
    between two engines in the same state, batched with greedy and unseeded requests; the
    argmax-only samplers (temperature 1e-4, top_k=1) give the greedy output, prefix-cache hits
    included; no KV slot of either pool leaked.

    (Same state: after a prefix-cache hit the head has no features for the cached positions, so
    its drafts, and with them a seeded request's random draws, may differ from a cold run's:
    seeded output is reproducible given the same drafts. A random head's drafts are seldom
    accepted at all; every accepted path length of a sampled tree verify is reached with oracle
    trees in tests/models/test_spec_tree.py.)"""
    kind, _, _, base, spec = setup
    trees = [_tree_llm(spec, kind, 2) for _ in range(2)]
    speculator = trees[0].engine.speculator
    sampled_trees = []
    original = speculator.propose

    def spy(req, limit, batch_size):
        draft = original(req, limit, batch_size)
        if req.params.temperature > 0 and isinstance(draft, DraftTree):
            sampled_trees.append(len(draft) > draft.max_depth)  # (branched, not a chain)
        return draft

    speculator.propose = spy
    try:
        mixed = [SamplingParams(temperature=0.9, top_p=0.95, seed=3, max_tokens=16, ignore_eos=True), TREE,
                 SamplingParams(temperature=0.7, top_k=20, seed=4, max_tokens=16, ignore_eos=True),
                 SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)]
        runs = [[o.token_ids for o in t.generate(PROMPTS, mixed)] for t in trees]
        assert runs[0][:3] == runs[1][:3]  # the seeded two and the greedy one
        assert runs[0][1] == base.generate([PROMPTS[1]], TREE)[0].token_ids
        assert len(runs[0][3]) == 16
        greedy = [o.token_ids for o in base.generate(PROMPTS, TREE)]
        argmax_only = [SamplingParams(temperature=1e-4, seed=1, max_tokens=16, ignore_eos=True),
                       SamplingParams(temperature=1.0, top_k=1, max_tokens=16, ignore_eos=True)]
        for params in argmax_only:  # (the prompts hit the prefix cache now)
            assert [o.token_ids for o in trees[0].generate(PROMPTS, params)] == greedy
    finally:
        del speculator.propose
    assert len(sampled_trees) >= 10 and any(sampled_trees)
    for t in trees:
        assert t.engine.stats().spec_verify_steps > 0
        assert_no_slot_leaked(t)
        assert t.engine.speculator.num_slots_held == 0
