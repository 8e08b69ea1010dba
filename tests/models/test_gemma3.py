"""Gemma 3 (text) on tiny random-weight checkpoints written here, against transformers in fp32.

Four layers, sliding and global mixed, a sliding window of 8 with prompts up to 50 tokens (so
the window decides the result: the same checkpoint with the window widened gives other logits),
query_pre_attn_scalar != head_dim, head_dim * heads != hidden, GQA, linear RoPE scaling on the
global layers and a different RoPE base on the sliding ones. The oracle is transformers' eager
attention (it implements the soft-capping the SDPA path lacks).
"""

from __future__ import annotations

import json

import pytest
import torch

from anycore import LLM, SamplingParams
from anycore.config import ModelConfig
from tests.models.hf_oracle import hf_greedy

WINDOW = 8
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
PROMPTS = [[5, 17, 33, 99, 4, 250, 7], [9, 9, 9], list(range(10, 60)), [3, 141, 59, 26, 53, 58, 97, 93, 23, 84, 62]]
NEW = 16
GREEDY = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)


def _hf_config(**extra):
    from transformers import Gemma3TextConfig

    base = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, max_position_embeddings=512, sliding_window=WINDOW,
                layer_types=LAYER_TYPES, query_pre_attn_scalar=24, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}},
                attn_implementation="eager")
    return Gemma3TextConfig(**{**base, **extra})


def _random_model(cfg):
    from transformers import Gemma3ForCausalLM

    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # the embedding is scaled by sqrt(hidden) = 8 and tied to the head: kept small so the
            # logits are not dominated by the input token's own row
            p.normal_(0, 0.05 if "embed" in name else 0.2)
    return model.eval()


def _write(folder, model, tokenizer, config_json=None):
    model.save_pretrained(folder)
    if config_json is not None:
        (folder / "config.json").write_text(json.dumps(config_json))
    tokenizer.save_pretrained(folder)


def _hf_logprobs(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].log_softmax(-1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tokenizer):
    """(folder, transformers model, our LLM) for the plain tiny checkpoint."""
    folder = tmp_path_factory.mktemp("gemma3")
    model = _random_model(_hf_config())
    _write(folder, model, tokenizer)
    return folder, model, LLM(model=str(folder), dtype="float32", kv_cache_gb=0.01)


@pytest.fixture(scope="module")
def expected(tiny):
    _, model, _ = tiny
    return [hf_greedy(model, p, NEW) for p in PROMPTS]


def test_config_is_read(tiny):
    _, _, llm = tiny
    mc = llm.engine.model_config
    assert mc.architecture == "Gemma3ForCausalLM"
    assert mc.layer_sliding_windows == (WINDOW, WINDOW, None, WINDOW)
    assert (mc.rope_theta, mc.rope_local_theta, mc.query_pre_attn_scalar) == (1e6, 10000.0, 24.0)
    assert mc.rope_scaling["rope_type"] == "linear" and mc.tie_word_embeddings and mc.qk_norm


def test_runs_op_by_op(tiny):
    _, _, llm = tiny
    native = llm.engine.runner.native
    assert native.stack(torch.float32) is None and not native.can_decode_greedy()
    assert native.layers_path().startswith("op by op (Gemma3ForCausalLM:")


def test_prompt_logprobs_match_transformers_and_the_window_matters(tiny):
    folder, model, llm = tiny
    ids = PROMPTS[2]
    ref = _hf_logprobs(model, ids)
    got = llm.engine.next_token_logprobs(ids)
    torch.testing.assert_close(got, ref, atol=2e-4, rtol=2e-4)
    # the same weights without a window: other logits past the window (so the test can fail)
    wide = _random_model(_hf_config(sliding_window=512))
    assert (_hf_logprobs(wide, ids)[WINDOW:] - ref[WINDOW:]).abs().max() > 0.1
    torch.testing.assert_close(_hf_logprobs(wide, ids)[:WINDOW], ref[:WINDOW], atol=2e-4, rtol=2e-4)


def test_greedy_matches_transformers_token_for_token(tiny, expected):
    _, _, llm = tiny
    outs = llm.generate([list(p) for p in PROMPTS], GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert len({tuple(e) for e in expected}) == len(expected)


def test_chunked_prefill_gives_the_same_tokens(tiny, expected):
    _, _, llm = tiny
    sched = llm.engine.scheduler
    saved = sched.max_num_batched_tokens
    sched.max_num_batched_tokens = 3  # prefill in 3-token chunks (less the decodes sharing the step)
    try:
        outs = llm.generate([list(p) for p in PROMPTS], GREEDY)
    finally:
        sched.max_num_batched_tokens = saved
    assert [o.outputs[0].token_ids for o in outs] == expected


def test_prefix_cache_hit_gives_the_same_tokens(tiny, expected):
    _, _, llm = tiny
    radix = llm.engine.kv.radix
    ids, ref = PROMPTS[2], expected[2]
    llm.generate([list(ids)], GREEDY)
    before = radix.hit_tokens
    # the cached prefix is longer than the window: the sliding layers read only its tail
    out = llm.generate([list(ids) + [77, 78]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert radix.hit_tokens - before >= len(ids)
    model = tiny[1]
    assert out.outputs[0].token_ids == hf_greedy(model, list(ids) + [77, 78], 4)
    assert llm.generate([list(ids)], GREEDY)[0].outputs[0].token_ids == ref


def _window_pool_of(llm, num_window_slots):
    """Gives the engine a window pool of ``num_window_slots`` (a fresh KV manager over the same
    pool tensors, which hold more: only the first ids are handed out); returns the old manager."""
    from anycore.cache.manager import KVCacheManager

    e = llm.engine
    old = e.kv
    assert not e.scheduler.has_unfinished()
    e.kv = e.scheduler.kv = KVCacheManager(old.num_slots, old.radix is not None, old.swa.window, num_window_slots)
    e.runner.window_of = e.kv.swa.window_of
    return old


def test_sliding_layers_keep_their_kv_in_a_window_pool(tiny):
    _, _, llm = tiny
    e = llm.engine
    pool, swa = e.kv_pool, e.kv.swa
    assert swa is not None and swa.window == WINDOW
    assert pool.window_layers == (0, 1, 3)
    assert pool.k.shape[0] == 1 and pool.k_window.shape[:2] == (3, swa.num_slots)
    assert pool.k_layers[2].data_ptr() == pool.k.data_ptr()
    assert pool.k_layers[3].data_ptr() == pool.k_window[2].data_ptr()
    assert "3 sliding-window layers keep only their last 8 positions'" in e.kv_layout
    stats = e.stats()
    assert stats.kv_window_slots_total == swa.num_slots and stats.kv_window_slots_used == len(swa.tree_held)


def test_a_long_generation_holds_only_the_window_and_reuses_freed_window_slots(tiny):
    """A window pool of 3 windows plus a 5-token chunk serves a 50-token prompt and 40 new tokens
    (90 positions), chunked, next to a second request: freed window slots are written again,
    and the tokens still equal transformers'."""
    _, model, llm = tiny
    e = llm.engine
    chunk = 5
    old = _window_pool_of(llm, 3 * WINDOW + chunk)
    sched = e.scheduler
    saved = sched.max_num_batched_tokens
    sched.max_num_batched_tokens = chunk
    e.kv.radix = None  # (no prefix cache: the bound below is the requests' windows alone)
    try:
        params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
        ids = [e.add_request(list(PROMPTS[2]), params), e.add_request(list(PROMPTS[3]), params)]
        tokens = {i: [] for i in ids}
        assignments = set()  # (full slot, window slot) pairs seen between steps
        while e.has_unfinished():
            for o in e.step():
                tokens[o.request_id] += o.new_token_ids
            e.kv.check_integrity()
            held = (e.kv.swa.window_of >= 0).nonzero()[0]
            assignments |= set(zip(held.tolist(), e.kv.swa.window_of[held].tolist()))
            # two requests, each its last WINDOW - 1 positions between steps
            assert e.kv.swa.num_used <= 2 * (WINDOW - 1)
        assert sched.num_preemptions == 0
        assert len(assignments) > e.kv.swa.num_slots  # window slots were handed out again
        assert e.kv.swa.num_used == 0 and e.kv.num_used == 0
        assert tokens[ids[0]] == hf_greedy(model, PROMPTS[2], 40)
        assert tokens[ids[1]] == hf_greedy(model, PROMPTS[3], 40)
    finally:
        sched.max_num_batched_tokens = saved
        e.kv = sched.kv = old
        e.runner.window_of = old.swa.window_of


def test_abort_gives_every_window_slot_back(tiny):
    _, _, llm = tiny
    e = llm.engine
    before = e.kv.swa.num_used - len(e.kv.swa.tree_held)
    rid = e.add_request(list(range(100, 140)), SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    for _ in range(6):
        e.step()
    assert e.kv.swa.num_used > len(e.kv.swa.tree_held)
    e.abort(rid)
    assert not e.has_unfinished()
    e.kv.check_integrity()
    assert e.kv.swa.num_used - len(e.kv.swa.tree_held) == before == 0
    assert e.kv.radix.protected_size == 0


def test_prefix_hit_inside_a_generated_sequence_resumes_where_the_window_is_held(tiny):
    """The tree holds window KV only for the last WINDOW - 1 positions of what it cached: a
    prompt that continues 10 tokens into an earlier answer resumes after the earlier prompt
    (whose window tail the tree kept), not at its full match, and still equals transformers."""
    _, model, llm = tiny
    radix = llm.engine.kv.radix
    ids = [200 + i % 40 for i in range(30)]
    first = llm.generate([list(ids)], GREEDY)[0].outputs[0].token_ids
    follow = list(ids) + first[:10] + [77]
    hits = radix.hit_tokens
    out = llm.generate([follow], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    assert radix.hit_tokens - hits == len(ids)  # (the full match is 40: its window KV is gone)
    assert out.outputs[0].token_ids == hf_greedy(model, follow, 6)
    llm.engine.kv.check_integrity()


def test_speculative_verify_steps_roll_back_window_kv_and_keep_greedy_exact(tiny):
    """n-gram drafts on repetitive prompts past the window: rejected drafts' window slots go
    back (nothing left over), and the tokens equal transformers' greedy ones."""
    folder, model, _ = tiny
    llm = LLM(model=str(folder), dtype="float32", kv_cache_gb=0.01, speculative_algorithm="ngram",
              max_num_batched_tokens=6)
    prompts = [[5, 6, 7, 8, 9] * 6, [40, 41, 42] * 9 + [40]]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = llm.generate([list(p) for p in prompts], params)
    stats = llm.engine.stats()
    assert stats.spec_verify_steps > 0 and stats.spec_draft_tokens > stats.spec_accepted_tokens
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(model, p, 24) for p in prompts]
    kv = llm.engine.kv
    kv.check_integrity()
    assert kv.swa.num_used == len(kv.swa.tree_held) and kv.radix.protected_size == 0


def test_logit_softcapping_and_the_older_config_layout(tmp_path, tokenizer):
    """Final-logit soft-capping, read from a config.json in the layout older transformers wrote
    (rope_theta / rope_local_base_freq / rope_scaling, sliding_window_pattern)."""
    cfg = _hf_config(final_logit_softcapping=3.0,
                     layer_types=["sliding_attention", "full_attention"] * 2)
    model = _random_model(cfg)
    old = {k: v for k, v in json.loads(cfg.to_json_string()).items()
           if k not in ("rope_parameters", "layer_types", "_sliding_window_pattern")}
    old |= {"architectures": ["Gemma3ForCausalLM"], "rope_theta": 1e6, "rope_local_base_freq": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "sliding_window_pattern": 2}
    _write(tmp_path, model, tokenizer, old)
    mc = ModelConfig.from_hf(old)
    assert mc.layer_sliding_windows == (WINDOW, None, WINDOW, None)
    assert mc.final_logit_softcapping == 3.0
    llm = LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01)
    ids = PROMPTS[2]
    ref = _hf_logprobs(model, ids)
    torch.testing.assert_close(llm.engine.next_token_logprobs(ids), ref, atol=2e-4, rtol=2e-4)
    outs = llm.generate([list(p) for p in PROMPTS], GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(model, p, NEW) for p in PROMPTS]


@pytest.mark.parametrize("bad, message", [
    ({"hidden_activation": "gelu"}, "hidden_activation 'gelu'"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"layer_types": ["chunked_attention"] * 4}, "unsupported Gemma 3 layer types"),
    ({"sliding_window": None}, "no sliding_window"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
])
def test_unsupported_configs_are_refused(bad, message):
    hf = {"architectures": ["Gemma3ForCausalLM"], "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
          "num_hidden_layers": 4, "num_attention_heads": 4, "sliding_window": WINDOW, **bad}
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(hf)


# HF name -> llama.cpp's gemma3 tensor name (blk.N.<part>)
_GGUF_PARTS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
               "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
               "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
               "post_feedforward_layernorm": "post_ffw_norm"}


def _write_gguf(path, model, cfg):
    """What llama.cpp's converter writes for gemma3: its tensor names, norms with 1 added, no
    output.weight (tied), no layer pattern / local RoPE base / attention scalar keys."""
    import gguf

    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(1e6)
    w.add_sliding_window(cfg.sliding_window)
    w.add_vocab_size(cfg.vocab_size)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        arr = tensor.float().numpy()
        if name.endswith("norm.weight"):
            arr = arr + 1.0
        if name.startswith("model.layers."):
            layer, rest = name.removeprefix("model.layers.").split(".", 1)
            part, kind = rest.rsplit(".", 1)
            gguf_name = f"blk.{layer}.{_GGUF_PARTS[part]}.{kind}"
        else:
            gguf_name = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}[name]
        w.add_tensor(gguf_name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_gemma3_gguf_loads_as_llama_cpp_writes_it(tmp_path, tokenizer, monkeypatch):
    """Six layers, so llama.cpp's fixed pattern (every 6th global) applies; the oracle is the HF
    model the file was written from, with llama.cpp's defaults for what the file lacks."""
    import anycore.loader.gguf_loader as gguf_loader

    cfg = _hf_config(num_hidden_layers=6, layer_types=None, query_pre_attn_scalar=32,
                     rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                      "full_attention": {"rope_type": "default", "rope_theta": 1e6}})
    assert cfg.layer_types[-1] == "full_attention" and cfg.layer_types.count("full_attention") == 1
    model = _random_model(cfg)
    _write_gguf(tmp_path / "tiny-gemma3.gguf", model, cfg)
    # the file carries no vocabulary: the tokenizer is not what this test is about
    monkeypatch.setattr(gguf_loader, "load_gguf_tokenizer", lambda path: tokenizer)
    llm = LLM(model=str(tmp_path / "tiny-gemma3.gguf"), dtype="float32", kv_cache_gb=0.01)
    mc = llm.engine.model_config
    assert mc.layer_sliding_windows == (WINDOW,) * 5 + (None,) and mc.query_pre_attn_scalar == 32
    ids = PROMPTS[2]
    torch.testing.assert_close(llm.engine.next_token_logprobs(ids), _hf_logprobs(model, ids), atol=2e-4, rtol=2e-4)
    outs = llm.generate([list(p) for p in PROMPTS[:2]], GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(model, p, NEW) for p in PROMPTS[:2]]
