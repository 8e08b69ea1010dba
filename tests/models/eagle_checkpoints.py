"""Random-weight EAGLE (EAGLE-1/2 layout) and EAGLE-3 (HF layout) head checkpoints, and a
random Llama target for them, written by the tests; plus a plain-torch reference of the heads
(whole sequence, no KV cache) that the engine's drafts are checked against."""

from __future__ import annotations

import json
import math

import torch

H, HEADS, KV_HEADS, FFN, VOCAB, DRAFT_VOCAB = 64, 4, 2, 128, 256, 96


def write_target(folder, tokenizer, num_layers: int, config_class: str = "LlamaConfig", **config):
    """A random target with the heads' shapes (Llama, or ``config_class`` with extra ``config``
    fields, e.g. Qwen2 for MiMo's MTP layers), saved by transformers; returns the model."""
    import transformers

    torch.manual_seed(0)
    cfg = getattr(transformers, config_class)(
        vocab_size=VOCAB, hidden_size=H, intermediate_size=FFN, num_hidden_layers=num_layers,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, **config)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model.eval()


def _layer(prefix: str, attn_in: int, g: torch.Generator, input_norm: bool, hidden_norm: bool) -> dict:
    d = H // HEADS

    def w(*shape):
        return torch.randn(*shape, generator=g) * (1.0 / math.sqrt(shape[-1]))

    t = {f"{prefix}self_attn.q_proj.weight": w(HEADS * d, attn_in), f"{prefix}self_attn.k_proj.weight": w(KV_HEADS * d, attn_in),
         f"{prefix}self_attn.v_proj.weight": w(KV_HEADS * d, attn_in), f"{prefix}self_attn.o_proj.weight": w(H, HEADS * d),
         f"{prefix}mlp.gate_proj.weight": w(FFN, H), f"{prefix}mlp.up_proj.weight": w(FFN, H),
         f"{prefix}mlp.down_proj.weight": w(H, FFN),
         f"{prefix}post_attention_layernorm.weight": 1 + 0.1 * torch.randn(H, generator=g)}
    if input_norm:
        t[f"{prefix}input_layernorm.weight"] = 1 + 0.1 * torch.randn(H, generator=g)
    if hidden_norm:
        t[f"{prefix}hidden_norm.weight"] = 1 + 0.1 * torch.randn(H, generator=g)
    return t


def write_eagle(folder, kind: str, layer_ids: list[int] | None = None, seed: int = 1) -> dict[str, torch.Tensor]:
    """An ``eagle`` (fc 2H -> H with bias, ``layers.0`` without input norm) or ``eagle3`` head
    (fc 3H -> H, ``midlayer`` over 2H, own norm, a ``DRAFT_VOCAB`` head with d2t / t2d)."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    config = dict(hidden_size=H, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, intermediate_size=FFN,
                  vocab_size=VOCAB, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=512,
                  num_hidden_layers=1)
    if kind == "eagle":
        config["architectures"] = ["LlamaForCausalLM"]
        t = {"fc.weight": torch.randn(H, 2 * H, generator=g) / math.sqrt(2 * H), "fc.bias": 0.1 * torch.randn(H, generator=g)}
        t |= _layer("layers.0.", H, g, False, False)
    else:
        config |= dict(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=DRAFT_VOCAB)
        if layer_ids is not None:
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": layer_ids}
        t = {"fc.weight": torch.randn(H, 3 * H, generator=g) / math.sqrt(3 * H),
             "norm.weight": 1 + 0.1 * torch.randn(H, generator=g),
             "lm_head.weight": torch.randn(DRAFT_VOCAB, H, generator=g) * 0.5}
        t |= _layer("midlayer.", 2 * H, g, True, True)
        kept = torch.sort(torch.randperm(VOCAB, generator=g)[:DRAFT_VOCAB]).values  # draft id -> target id
        t["d2t"] = kept - torch.arange(DRAFT_VOCAB)
        t2d = torch.zeros(VOCAB, dtype=torch.bool)
        t2d[kept] = True
        t["t2d"] = t2d
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in t.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return t


# ---- reference ------------------------------------------------------------------------------
def _rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, d):
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    ang = pos[:, None].float() * inv[None]
    cos, sin = torch.cat((ang, ang), -1).cos()[:, None], torch.cat((ang, ang), -1).sin()[:, None]
    x = x.view(x.shape[0], -1, d)
    rot = torch.cat((-x[..., d // 2:], x[..., : d // 2]), -1)
    return (x * cos + rot * sin)


def _ref_layer(t: dict, p: str, attn_in: torch.Tensor, residual: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    d = H // HEADS
    q = _rope(attn_in @ t[p + "self_attn.q_proj.weight"].T, pos, d).transpose(0, 1)
    k = _rope(attn_in @ t[p + "self_attn.k_proj.weight"].T, pos, d).transpose(0, 1)
    v = (attn_in @ t[p + "self_attn.v_proj.weight"].T).view(-1, KV_HEADS, d).transpose(0, 1)
    k, v = k.repeat_interleave(HEADS // KV_HEADS, 0), v.repeat_interleave(HEADS // KV_HEADS, 0)
    n = attn_in.shape[0]
    scores = (q @ k.transpose(1, 2)) / math.sqrt(d) + torch.full((n, n), float("-inf")).triu(1)
    a = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, -1) @ t[p + "self_attn.o_proj.weight"].T
    h = residual + a
    x = _rms(h, t[p + "post_attention_layernorm.weight"])
    gate, up = x @ t[p + "mlp.gate_proj.weight"].T, x @ t[p + "mlp.up_proj.weight"].T
    return h + (torch.nn.functional.silu(gate) * up) @ t[p + "mlp.down_proj.weight"].T


@torch.no_grad()
def reference_drafts(kind: str, t: dict, target, tokens: list[int], k: int, layers: tuple[int, ...]) -> list[int]:
    """The head's k greedy drafts after ``tokens``, recomputing the whole sequence each time.
    ``target``: the transformers model; ``layers``: EAGLE-3's captured layer inputs."""
    pre_norm = []
    hook = target.model.norm.register_forward_hook(lambda m, args, res: pre_norm.append(args[0]))
    try:
        out = target(torch.tensor([tokens]), output_hidden_states=True)
    finally:
        hook.remove()
    # transformers' last entry is the final normed state; the stream after the last layer is the norm's input
    streams = list(out.hidden_states[:-1]) + pre_norm
    if kind == "eagle":
        feats = out.hidden_states[-1][0]
    else:
        feats = torch.cat([streams[i][0] for i in layers], -1) @ t["fc.weight"].T
    emb_table = target.model.embed_tokens.weight
    head = target.lm_head.weight
    ids = list(tokens[1:])
    hidden = list(feats[: len(tokens) - 1])  # position i: (token i + 1, feature i)
    drafts: list[int] = []
    for _ in range(k):
        emb = emb_table[torch.tensor(ids)]
        hs = torch.stack(hidden)
        pos = torch.arange(len(ids))
        if kind == "eagle":
            x = torch.cat((emb, hs), -1) @ t["fc.weight"].T + t["fc.bias"]
            o = _ref_layer(t, "layers.0.", x, x, pos)
            nxt = int((o[-1] @ head.T).argmax())
        else:
            x = torch.cat((_rms(emb, t["midlayer.input_layernorm.weight"]), _rms(hs, t["midlayer.hidden_norm.weight"])), -1)
            o = _ref_layer(t, "midlayer.", x, hs, pos)
            d = int((_rms(o[-1], t["norm.weight"]) @ t["lm_head.weight"].T).argmax())
            nxt = d + int(t["d2t"][d])
        drafts.append(nxt)
        ids.append(nxt)
        hidden.append(o[-1])  # (EAGLE-1 feeds it through fc with the token; EAGLE-3 as the hidden)
    return drafts


def assert_chunked_prefill_and_prefix_hits_identical(base, spec, prompts, params) -> None:
    """A head speculator's greedy output equals the plain one with 8-token prefill chunks
    (features arrive chunk by chunk) and with prefix-cache hits (positions without features)."""
    sched = spec.engine.scheduler
    expected = [o.token_ids for o in base.generate(prompts, params)]
    budget = sched.max_num_batched_tokens
    sched.max_num_batched_tokens = 8
    try:
        assert [o.token_ids for o in spec.generate(prompts, params)] == expected
        shared = [prompts[2] + [7, 8, 9], prompts[2] + [3]]  # (prompts[2] is in the prefix cache)
        assert [o.token_ids for o in spec.generate(shared, params)] == \
            [o.token_ids for o in base.generate(shared, params)]
    finally:
        sched.max_num_batched_tokens = budget
