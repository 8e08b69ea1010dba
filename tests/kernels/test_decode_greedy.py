"""Decode bursts give exactly the tokens, text, stops and KV of one-token steps.

csrc/common/decode_greedy.cpp runs several greedy tokens of a request decoding alone in one
native call (embedding, decoder stack, final norm, logits head, argmax per token); the engine
applies stops afterwards (one step kind: Scheduler.schedule(max_steps), Scheduler.update). Whatever the burst length,
threads and Llama-family variant, dense or W8A8 (body, head, embedding table: its own int8 rows
when untied, the int8 head's rows when tied), the outputs, finish reasons and the
KV pool must equal those of ordinary one-token steps (`decode_burst=0`: forward, logits head
and sampler), and a stop inside a burst must leave no slot behind.
"""

from __future__ import annotations

import pytest
import torch

from anycore import LLM, SamplingParams
from anycore.config import OFFLINE_DECODE_BURST
from tests.models.test_tiny_models import _configs, write_checkpoint

QUANT = {
    "bf16": {},
    "w8a8": {"quantization": "w8a8_int8"},
    "w8a8-head": {"quantization": "w8a8_int8", "quantize_lm_head": True},
    "w8a8-head-embed": {"quantization": "w8a8_int8", "quantize_lm_head": True, "quantize_embedding": True},
}


@pytest.fixture
def restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _run(model_dir: str, burst: int, threads: int, quant: dict, params_list):
    llm = LLM(model=model_dir, dtype="bfloat16", kv_cache_gb=0.01, threads=threads, decode_burst=burst, **quant)
    engine = llm.engine
    if burst >= 1 and not engine.runner.native.can_decode_greedy():
        pytest.skip("no native decode burst here (extension unavailable or some op not native)")
    results, steps = [], 0
    for prompt, params in params_list:
        engine.add_request(prompt, params)
        tokens, text, reason = [], "", None
        while engine.has_unfinished():
            steps += 1
            for o in engine.step():
                tokens += o.new_token_ids
                text += o.delta_text
                reason = o.finish_reason
        results.append((tokens, text, reason))
    used = engine.kv.num_used
    return results, engine.kv_pool.k.clone(), engine.kv_pool.v.clone(), used, steps


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("quant", sorted(QUANT))
@pytest.mark.parametrize("name", sorted(_configs()))
def test_bursts_equal_single_steps(tmp_path, tokenizer, restore_threads, name, quant, threads):
    write_checkpoint(tmp_path, name, tokenizer)
    runs = [([3 + i % 250 for i in range(40)], SamplingParams(temperature=0, max_tokens=11, ignore_eos=True)),
            ([7, 8, 9], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))]
    one, k1, v1, used1, steps1 = _run(str(tmp_path), 0, threads, QUANT[quant], runs)
    for burst in (1, 4):
        many, k, v, used, steps = _run(str(tmp_path), burst, threads, QUANT[quant], runs)
        assert many == one
        assert torch.equal(k, k1) and torch.equal(v, v1) and used == used1
        if burst > 1:
            assert steps < steps1  # the bursts really ran (one step per token without them)


@pytest.mark.parametrize("burst", [1, 3, 8])
def test_stops_inside_a_burst(tmp_path, tokenizer, restore_threads, burst):
    """A stop token and a stop string in the middle of a burst end the request where single
    steps end it, and the burst's KV slots past the stop are released."""
    write_checkpoint(tmp_path, "llama-untied-llama3-rope", tokenizer)
    prompt = [5 + i for i in range(20)]
    free = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    (ref,), *_ = _run(str(tmp_path), 0, 2, {}, [(prompt, free)])
    tokens, text, _ = ref
    stop_token = tokens[4]
    first = tokens.index(stop_token)
    stop_text = tokenizer.decode(tokens[6:8]).strip()
    runs = [(prompt, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_token])),
            (prompt, SamplingParams(temperature=0, max_tokens=12, stop=[stop_text] if stop_text else None))]
    one, _, _, used1, _ = _run(str(tmp_path), 0, 2, {}, runs)
    many, _, _, used_many, _ = _run(str(tmp_path), burst, 2, {}, runs)
    assert many == one
    assert one[0][0] == tokens[: first + 1] and one[0][2] == "stop"
    assert used_many == used1  # only the prefix cache holds slots; nothing leaked past the stops


def test_no_burst_when_it_cannot_be_exact(tmp_path, tokenizer, restore_threads):
    """Logprobs and sampling take one-token steps."""
    write_checkpoint(tmp_path, "qwen2-qkv-bias", tokenizer)
    llm = LLM(model=str(tmp_path), dtype="bfloat16", kv_cache_gb=0.01, threads=2, decode_burst=4)
    if not llm.engine.runner.native.can_decode_greedy():
        pytest.skip("no native decode burst here")
    engine = llm.engine
    for params in (SamplingParams(temperature=0, max_tokens=5, logprobs=1),
                   SamplingParams(temperature=0.8, max_tokens=5, seed=1)):
        engine.add_request([7, 8, 9], params)
        while engine.has_unfinished():
            assert all(len(o.new_token_ids) == 1 for o in engine.step())


def test_offline_api_decodes_in_offline_bursts(tmp_path, tokenizer, restore_threads):
    """LLM with decode_burst unset: a greedy request alone takes OFFLINE_DECODE_BURST tokens a
    step (nothing streams), with the tokens of one-token steps."""
    write_checkpoint(tmp_path, "qwen2-qkv-bias", tokenizer)
    llm = LLM(model=str(tmp_path), dtype="bfloat16", kv_cache_gb=0.01, threads=2)
    if not llm.engine.runner.native.can_decode_greedy():
        pytest.skip("no native decode burst here")
    params = SamplingParams(temperature=0, max_tokens=2 * OFFLINE_DECODE_BURST + 1, ignore_eos=True)
    engine, sizes, tokens = llm.engine, [], []
    engine.add_request([7, 8, 9], params)
    while engine.has_unfinished():
        for o in engine.step():
            sizes.append(len(o.new_token_ids))
            tokens += o.new_token_ids
    assert sizes == [1, OFFLINE_DECODE_BURST, OFFLINE_DECODE_BURST]  # the prefill's token, then two bursts
    single = LLM(model=str(tmp_path), dtype="bfloat16", kv_cache_gb=0.01, threads=2, decode_burst=0)
    assert single.generate([[7, 8, 9]], params)[0].outputs[0].token_ids == tokens


SAMPLED = [SamplingParams(temperature=0.8, max_tokens=9, seed=1, ignore_eos=True),
           SamplingParams(temperature=1.0, top_p=0.9, top_k=40, max_tokens=9, seed=2, ignore_eos=True),
           SamplingParams(temperature=0.7, repetition_penalty=1.3, max_tokens=9, seed=3, ignore_eos=True),
           SamplingParams(temperature=0, logprobs=2, max_tokens=9, ignore_eos=True)]


@pytest.mark.parametrize("quant", ["bf16", "w8a8-head-embed"])
@pytest.mark.parametrize("name", ["llama-untied-llama3-rope", "qwen2-qkv-bias"])
def test_a_request_sampling_alone_takes_one_native_call_with_the_same_bits(tmp_path, tokenizer, restore_threads,
                                                                          name, quant):
    """Sampling, penalties and logprobs from csrc's decode_logits (the step's logits in one native
    call, sampled in Python) equal the runner's forward + head + sampler (``decode_burst=0``):
    tokens, logprobs and KV."""
    write_checkpoint(tmp_path, name, tokenizer)

    def run(burst: int):
        llm = LLM(model=str(tmp_path), dtype="bfloat16", kv_cache_gb=0.01, threads=2, decode_burst=burst,
                  **QUANT[quant])
        engine = llm.engine
        native = engine.runner.native
        if burst and not native.can_decode_greedy():
            pytest.skip("no native decode here")
        calls = []
        step_logits = native.decode_logits
        native.decode_logits = lambda *a: calls.append(1) or step_logits(*a)
        outs = []
        for params in SAMPLED:
            engine.add_request([3 + i % 200 for i in range(30)], params)
            tokens, lps = [], []
            while engine.has_unfinished():
                for o in engine.step():
                    tokens += o.new_token_ids
                    lps += [(lp.token_id, lp.logprob, lp.top) for lp in o.new_logprobs]
            outs.append((tokens, lps))
        return outs, engine.kv_pool.k.clone(), len(calls)

    ref, k_ref, calls_ref = run(0)
    got, k, calls = run(1)
    # every decode after the first token (greedy with logprobs too), and the prompt's last token
    # where the prefix cache served the rest (the 2nd .. 4th request: the same prompt)
    assert calls_ref == 0 and calls == 4 * 8 + 3
    assert got == ref
    assert torch.equal(k, k_ref)
    assert ref[3][1] and all(len(top) == 2 for _, _, top in ref[3][1])  # the logprobs really came out


@pytest.mark.parametrize("quant", ["bf16", "w8a8-head-embed"])
def test_a_request_verifying_a_draft_alone_takes_one_native_call_with_the_same_bits(tmp_path, tokenizer,
                                                                                    restore_threads, quant):
    """A chain draft verified alone: every row's logits from one decode_logits call (a causal
    extend) equal the runner's batch + forward + head (``decode_burst=0``), so the tokens and the
    KV agree. Seeded sampling requests: they draft the full k whatever the step times (a greedy
    one's drafts follow measured costs, which differ between runs), and their verification reads
    the exact probabilities."""
    write_checkpoint(tmp_path, "llama-untied-llama3-rope", tokenizer)
    prompt = [3 + i % 7 for i in range(40)]  # repeats: the n-gram proposer always finds a match
    params = [SamplingParams(temperature=0.8, max_tokens=12, seed=5, ignore_eos=True),
              SamplingParams(temperature=0.3, top_k=5, max_tokens=12, seed=9, ignore_eos=True)]

    def run(burst: int):
        llm = LLM(model=str(tmp_path), dtype="bfloat16", kv_cache_gb=0.01, threads=2, decode_burst=burst,
                  speculative_algorithm="ngram", ngram_prompt_lookup_min=1, speculative_min_acceptance=0.0,
                  enable_prefix_caching=False, **QUANT[quant])
        engine = llm.engine
        native = engine.runner.native
        if burst and not native.can_decode_greedy():
            pytest.skip("no native decode here")
        extends = []
        step_logits = native.decode_logits
        native.decode_logits = lambda tokens, *a: extends.append(len(tokens)) or step_logits(tokens, *a)
        outs = []
        for p in params:
            engine.add_request(prompt, p)
            tokens = []
            while engine.has_unfinished():
                for o in engine.step():
                    tokens += o.new_token_ids
            outs.append(tokens)
        return outs, engine.kv_pool.k.clone(), engine.kv_pool.v.clone(), engine.stats(), extends

    ref, k_ref, v_ref, stats_ref, extends_ref = run(0)
    got, k, v, stats, extends = run(1)
    assert extends_ref == [] and any(n > 1 for n in extends)  # the verifies ran natively
    assert stats.spec_verify_steps == stats_ref.spec_verify_steps > 0
    assert stats.spec_accepted_tokens == stats_ref.spec_accepted_tokens
    assert got == ref
    assert torch.equal(k, k_ref) and torch.equal(v, v_ref)
