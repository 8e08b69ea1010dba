"""MTP drafting (``speculative_algorithm="mtp"``) on a random-weight MiMo checkpoint written here:
a Qwen2 target saved by transformers, relabelled ``MiMoForCausalLM``, plus ``model.mtp_layers.*``
tensors in MiMo's layout. The target alone still equals transformers' Qwen2 on the same weights;
the MTP head's drafts equal a plain whole-sequence reference of MiMo's MTP math written here;
greedy output is identical with and without MTP, alone, batched and with chunked prefill, with
no KV slot of either pool leaked; a target without MTP layers is refused with a clear error."""

from __future__ import annotations

import json
import math

import pytest
import torch

from anycore import LLM, SamplingParams
from tests.models.eagle_checkpoints import (
    FFN,
    HEADS,
    KV_HEADS,
    H,
    assert_chunked_prefill_and_prefix_hits_identical,
)
from tests.models.eagle_checkpoints import write_target as write_qwen2
from tests.models.hf_oracle import hf_greedy
from tests.models.test_speculative import PROMPTS, assert_no_slot_leaked

EPS, THETA = 1e-6, 10000.0
D = H // HEADS
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def write_target(folder, tokenizer, num_mtp_layers: int):
    """A 2-layer Qwen2 (q/k/v bias, untied head) as MiMo: its config says MiMoForCausalLM and
    ``num_nextn_predict_layers``; its MTP layers go in a second safetensors file. Returns the
    transformers Qwen2 model and the MTP tensors."""
    from safetensors.torch import save_file

    model = write_qwen2(folder, tokenizer, 2, "Qwen2Config", rms_norm_eps=EPS)
    config = json.loads((folder / "config.json").read_text())
    config |= dict(architectures=["MiMoForCausalLM"], model_type="mimo", num_nextn_predict_layers=num_mtp_layers)
    (folder / "config.json").write_text(json.dumps(config))
    tensors: dict[str, torch.Tensor] = {}
    for i in range(num_mtp_layers):
        tensors |= _mtp_layer(f"model.mtp_layers.{i}.", torch.Generator().manual_seed(10 + i))
    if tensors:
        save_file(tensors, str(folder / "model-mtp.safetensors"))
    return model, tensors


def _mtp_layer(p: str, g: torch.Generator, scale: float = 0.3) -> dict[str, torch.Tensor]:
    """Random, but near a copy of the target's feature (``input_proj``'s hidden half close to
    the identity, the rest ``scale`` times smaller), so the drafts repeat the newest token and
    some are accepted: verify steps accept all, some or none of the drafts."""
    def w(*shape):
        return torch.randn(*shape, generator=g) * (scale / math.sqrt(shape[-1]))

    def norm():
        return 1 + 0.1 * torch.randn(H, generator=g)

    t = {p + "token_layernorm.weight": norm(), p + "hidden_layernorm.weight": norm(),
         p + "input_proj.weight": torch.cat((torch.eye(H) + 0.2 * w(H, H), w(H, H)), 1),
         p + "final_layernorm.weight": norm(),
         p + "input_layernorm.weight": norm(), p + "post_attention_layernorm.weight": norm(),
         p + "self_attn.o_proj.weight": w(H, HEADS * D),
         p + "mlp.gate_proj.weight": w(FFN, H), p + "mlp.up_proj.weight": w(FFN, H), p + "mlp.down_proj.weight": w(H, FFN)}
    for name, rows in (("q_proj", HEADS * D), ("k_proj", KV_HEADS * D), ("v_proj", KV_HEADS * D)):
        t[f"{p}self_attn.{name}.weight"] = w(rows, H)
        t[f"{p}self_attn.{name}.bias"] = 0.3 * torch.randn(rows, generator=g)
    return t


# ---- reference: MiMo's MTP layer over a whole sequence, no KV cache ---------------------------
def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def _rope(x, pos):
    inv = 1.0 / (THETA ** (torch.arange(0, D, 2).float() / D))
    ang = torch.cat((pos[:, None].float() * inv[None],) * 2, -1)
    x = x.view(x.shape[0], -1, D)
    rot = torch.cat((-x[..., D // 2:], x[..., : D // 2]), -1)
    return x * ang.cos()[:, None] + rot * ang.sin()[:, None]


def _mtp_reference(t: dict, ids: list[int], feats: torch.Tensor, emb_table: torch.Tensor) -> torch.Tensor:
    """Row i: token ``ids[i]`` (its embedding zeroed at position 0) with feature ``feats[i]``;
    returns final_layernorm(the decoder layer's output) per row."""
    p = "model.mtp_layers.0."
    n = len(ids)
    pos = torch.arange(n)
    emb = emb_table[torch.tensor(ids)].clone()
    emb[0] = 0.0
    x = torch.cat((_rms(feats, t[p + "hidden_layernorm.weight"]), _rms(emb, t[p + "token_layernorm.weight"])), -1)
    x = x @ t[p + "input_proj.weight"].T
    a = _rms(x, t[p + "input_layernorm.weight"])

    def proj(name):
        return a @ t[f"{p}self_attn.{name}.weight"].T + t[f"{p}self_attn.{name}.bias"]

    q, k = _rope(proj("q_proj"), pos).transpose(0, 1), _rope(proj("k_proj"), pos).transpose(0, 1)
    v = proj("v_proj").view(n, KV_HEADS, D).transpose(0, 1)
    k, v = k.repeat_interleave(HEADS // KV_HEADS, 0), v.repeat_interleave(HEADS // KV_HEADS, 0)
    scores = (q @ k.transpose(1, 2)) / math.sqrt(D) + torch.full((n, n), float("-inf")).triu(1)
    h = x + (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, -1) @ t[p + "self_attn.o_proj.weight"].T
    m = _rms(h, t[p + "post_attention_layernorm.weight"])
    out = h + (torch.nn.functional.silu(m @ t[p + "mlp.gate_proj.weight"].T) * (m @ t[p + "mlp.up_proj.weight"].T)) \
        @ t[p + "mlp.down_proj.weight"].T
    return _rms(out, t[p + "final_layernorm.weight"])


@torch.no_grad()
def reference_drafts(t: dict, target, tokens: list[int], k: int) -> tuple[list[int], torch.Tensor]:
    """k greedy drafts after ``tokens``, and the layer's output at the newest position (the one
    that gives draft 1): the target's final normed hidden state at position i pairs with token
    i + 1; each draft's row pairs the draft with the layer's previous output (one MTP layer used
    recursively); logits from the target's LM head."""
    feats = target(torch.tensor([tokens]), output_hidden_states=True).hidden_states[-1][0]
    ids, hidden = list(tokens[1:]), list(feats[: len(tokens) - 1])
    drafts: list[int] = []
    first = None
    for _ in range(k):
        o = _mtp_reference(t, ids, torch.stack(hidden), target.model.embed_tokens.weight)
        first = o[-1] if first is None else first
        nxt = int((o[-1] @ target.lm_head.weight.T).argmax())
        drafts.append(nxt)
        ids.append(nxt)
        hidden.append(o[-1])
    return drafts, first


# ---- tests ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def setup(tmp_path_factory, tokenizer):
    folder = tmp_path_factory.mktemp("mimo")
    hf, tensors = write_target(folder, tokenizer, num_mtp_layers=2)  # (layer 1 is present but unused)
    base = LLM(model=str(folder), dtype="float32", kv_cache_gb=0.01)
    spec = LLM(model=str(folder), dtype="float32", kv_cache_gb=0.01, speculative_algorithm="mtp",
               num_speculative_tokens=3, speculative_min_acceptance=0.0)
    return hf, tensors, base, spec


def test_target_ignores_its_mtp_layers_and_matches_transformers_qwen2(setup):
    hf, tensors, base, _ = setup
    model = base.engine.model
    assert sorted(model.mtp_weight_names) == sorted(tensors)  # set aside by name, not lost
    assert not any("mtp" in name for name, _ in model.named_parameters())
    prompts = [PROMPTS[0], PROMPTS[1]]
    for prompt, out in zip(prompts, base.generate(prompts, GREEDY)):
        assert out.token_ids == hf_greedy(hf, prompt, GREEDY.max_tokens)


def test_drafts_match_the_reference_mtp_layer(setup):
    hf, tensors, _, spec = setup
    speculator = spec.engine.speculator
    assert speculator.capture_layers == ()  # (the target's final normed hidden state)
    seen: list[tuple[list[int], list[int], torch.Tensor]] = []
    original = speculator.propose

    def spy(req, limit, batch_size):
        draft = original(req, limit, batch_size)
        if draft:
            seen.append((list(req.all_token_ids), draft, speculator.states[req.request_id].last_out[0].clone()))
        return draft

    speculator.propose = spy
    try:
        spec.generate([PROMPTS[0], PROMPTS[2]], GREEDY)
    finally:
        del speculator.propose
    assert len(seen) >= 4
    for tokens, draft, out in seen[:8]:
        want, want_out = reference_drafts(tensors, hf, tokens, len(draft))
        assert draft == want
        torch.testing.assert_close(out, want_out, rtol=1e-4, atol=1e-4)


def test_greedy_output_is_identical(setup):
    _, _, base, spec = setup
    expected = [o.token_ids for o in base.generate(PROMPTS, GREEDY)]
    for prompt, want in zip(PROMPTS, expected):  # alone
        assert spec.generate([prompt], GREEDY)[0].token_ids == want
    assert [o.token_ids for o in spec.generate(PROMPTS, GREEDY)] == expected  # batched
    stats = spec.engine.stats()
    assert stats.spec_verify_steps > 0 and 0 < stats.spec_accepted_tokens < stats.spec_draft_tokens
    assert_no_slot_leaked(spec)
    assert spec.engine.speculator.num_slots_held == 0  # the head's KV given back too


def test_chunked_prefill_and_prefix_hits_keep_output_identical(setup):
    _, _, base, spec = setup
    assert_chunked_prefill_and_prefix_hits_identical(base, spec, PROMPTS, GREEDY)
    assert_no_slot_leaked(spec)
    assert spec.engine.speculator.num_slots_held == 0


def test_tree_drafts_keep_greedy_output_identical(setup):
    _, _, base, spec = setup
    tree = LLM(model=spec.engine.config.model, dtype="float32", kv_cache_gb=0.01, speculative_algorithm="mtp",
               num_speculative_tokens=3, speculative_eagle_topk=2, speculative_min_acceptance=0.0)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = [o.token_ids for o in base.generate(PROMPTS, params)]
    assert [o.token_ids for o in tree.generate(PROMPTS, params)] == expected
    assert tree.engine.stats().spec_verify_steps > 0
    assert_no_slot_leaked(tree)
    assert tree.engine.speculator.num_slots_held == 0


@pytest.mark.parametrize("arch,declared", [("MiMoForCausalLM", 0), ("MiMoForCausalLM", 1), ("Qwen2ForCausalLM", 0)])
def test_a_target_without_mtp_layers_is_refused(tmp_path, tokenizer, arch, declared):
    """No MTP tensors (a MiMo config may still declare some): a clear error, before any
    request; the same checkpoint serves without speculation."""
    write_target(tmp_path, tokenizer, num_mtp_layers=0)
    config = json.loads((tmp_path / "config.json").read_text())
    config |= {"architectures": [arch], "num_nextn_predict_layers": declared}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="has none.*model.mtp_layers"):
        LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01, speculative_algorithm="mtp")
    assert LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01).generate([[5, 6]], GREEDY)[0].token_ids


def test_mtp_takes_no_head_folder():
    from anycore.spec.policy import SpeculativeConfig

    with pytest.raises(ValueError, match="own MTP layers"):
        SpeculativeConfig(algorithm="mtp", draft_model="/some/head")
    SpeculativeConfig(algorithm="mtp", eagle_topk=2)
