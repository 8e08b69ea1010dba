"""``anycore train-draft``: trains an EAGLE head (EAGLE-1/2 layout) for a target model on CPU.

Data: the target's own greedy continuations of text windows (what verification will accept),
or the text itself. One target forward per sequence gives, at every position i, the final
normed hidden state h_i (the EAGLE feature) and the target's greedy next token a_i. The head
learns, from (embedding of token i + 1, h_i), to output h_{i+1} (smooth-L1, the feature it
feeds itself while drafting) whose LM-head logits give a_{i+1} (cross-entropy), as EAGLE does.

The head's decoder layer starts from the target's last layer's q/k/v and gate/up with its
output projections at zero, and ``fc`` from "take the feature" (zeros on the embedding half):
training starts from "the next feature is this one", a sane scale. The
embedding and LM head are the target's, frozen. The result is written as an HF folder
(``config.json`` + ``model.safetensors``) that ``--speculative-algorithm eagle
--speculative-model DIR`` loads.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from anycore.llm import LLM
from anycore.sampling_params import SamplingParams
from anycore.scheduler.request import Request
from anycore.scheduler.scheduler import ScheduledRequest, SchedulerOutput


@torch.inference_mode()
def target_features(llm: LLM, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(h [n, H] final normed hidden states, a [n] greedy next tokens) of a sequence."""
    engine = llm.engine
    req = Request("train-draft", list(tokens), SamplingParams(max_tokens=1))
    slots = engine.kv.allocate(len(tokens))
    if slots is None:
        raise ValueError("not enough free KV slots for this sequence")
    req.slots = slots
    hidden = []
    try:
        step = engine.scheduler.max_num_batched_tokens
        for start in range(0, len(tokens), step):
            n = min(step, len(tokens) - start)
            batch = engine.runner.build_batch(SchedulerOutput([ScheduledRequest(req, start, n, True)]))
            batch.logits_indices = torch.arange(n)
            hidden.append(engine.model(batch, None).float())
    finally:
        engine.kv.free(slots)
    h = torch.cat(hidden)
    return h, engine.model.compute_logits(h.to(engine.dtype)).argmax(dim=-1)


class TrainableHead(nn.Module):
    """The EAGLE-1 head in plain torch (autograd), named as its checkpoint."""

    def __init__(self, llm: LLM) -> None:
        super().__init__()
        model = llm.engine.model
        cfg = model.config
        self.cfg = cfg
        h, d = cfg.hidden_size, cfg.head_dim
        last = model.layers[-1]
        q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
        qkv = last.self_attn.qkv_proj.weight.detach().float()
        gate_up = last.mlp.gate_up_proj.weight.detach().float()
        width = gate_up.shape[0] // 2

        def param(t: torch.Tensor) -> nn.Parameter:
            return nn.Parameter(t.clone().contiguous())

        self.fc_weight = param(torch.cat((torch.zeros(h, h), torch.eye(h)), dim=1) + 0.01 * torch.randn(h, 2 * h))
        self.fc_bias = param(torch.zeros(h))
        self.q, self.k, self.v = param(qkv[:q]), param(qkv[q : q + kv]), param(qkv[q + kv :])
        # the residual branches' outputs start at zero: the head starts as "the next feature is
        # this one" (the target's last layer's outputs are far larger than a normed feature)
        self.o = param(torch.zeros_like(last.self_attn.o_proj.weight, dtype=torch.float32))
        self.gate, self.up = param(gate_up[:width]), param(gate_up[width:])
        self.down = param(torch.zeros_like(last.mlp.down_proj.weight, dtype=torch.float32))
        self.post_norm = param(last.post_attention_layernorm.weight.detach().float())
        self.embed = model.embed_tokens.weight.detach().float().clone()
        head = model.lm_head.weight if model.lm_head.tied_to is None else model.embed_tokens.weight
        self.head = head.detach().float().clone()
        self.cos, self.sin = model.rotary.cos.clone(), model.rotary.sin.clone()

    def _rope(self, x: torch.Tensor, n: int) -> torch.Tensor:
        d = self.cfg.head_dim
        x = x.view(n, -1, d)
        cos, sin = self.cos[:n, None], self.sin[:n, None]
        rot = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1)
        return x * cos + rot * sin

    def forward(self, ids: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        """Outputs for one sequence: row i from (token ids[i], feature feats[i]), causal."""
        cfg, n = self.cfg, ids.shape[0]
        x = torch.cat((self.embed[ids], feats), dim=-1) @ self.fc_weight.T + self.fc_bias
        q = self._rope(x @ self.q.T, n).transpose(0, 1)
        k = self._rope(x @ self.k.T, n).transpose(0, 1)
        v = (x @ self.v.T).view(n, -1, cfg.head_dim).transpose(0, 1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=cfg.num_heads != cfg.num_kv_heads)
        hid = x + a.transpose(0, 1).reshape(n, -1) @ self.o.T
        y = hid * torch.rsqrt(hid.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * self.post_norm
        return hid + (F.silu(y @ self.gate.T) * (y @ self.up.T)) @ self.down.T

    def save(self, folder: str | Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        p = "layers.0."
        t = {"fc.weight": self.fc_weight, "fc.bias": self.fc_bias, f"{p}self_attn.q_proj.weight": self.q,
             f"{p}self_attn.k_proj.weight": self.k, f"{p}self_attn.v_proj.weight": self.v,
             f"{p}self_attn.o_proj.weight": self.o, f"{p}mlp.gate_proj.weight": self.gate,
             f"{p}mlp.up_proj.weight": self.up, f"{p}mlp.down_proj.weight": self.down,
             f"{p}post_attention_layernorm.weight": self.post_norm}
        save_file({k: v.detach().contiguous() for k, v in t.items()}, str(folder / "model.safetensors"))
        cfg = self.cfg
        config = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=cfg.hidden_size,
                      num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
                      head_dim=cfg.head_dim, intermediate_size=self.gate.shape[0], num_hidden_layers=1,
                      vocab_size=cfg.vocab_size, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
                      rope_scaling=cfg.rope_scaling, max_position_embeddings=cfg.max_position_embeddings)
        (folder / "config.json").write_text(json.dumps(config, indent=1))


def build_sequences(llm: LLM, token_ids: list[int], num: int, prompt_len: int, gen_len: int,
                    generate: bool, seed: int) -> list[list[int]]:
    """``num`` windows of the text: each a ``prompt_len``-token prompt and the target's greedy
    continuation of ``gen_len`` tokens (``generate``), or ``prompt_len + gen_len`` text tokens."""
    rng = random.Random(seed)
    span = prompt_len + (0 if generate else gen_len)
    starts = [rng.randrange(0, max(1, len(token_ids) - span)) for _ in range(num)]
    windows = [token_ids[s : s + span] for s in starts]
    if not generate:
        return windows
    outs = llm.generate(windows, SamplingParams(temperature=0.0, max_tokens=gen_len, ignore_eos=True))
    return [w + o.token_ids for w, o in zip(windows, outs)]


def train(llm: LLM, sequences: list[list[int]], steps: int, lr: float = 3e-4, ce_weight: float = 1.0,
          seed: int = 0, log=print) -> TrainableHead:
    """Trains a head on ``sequences`` (one sequence per step, cycling), Adam with cosine decay."""
    torch.manual_seed(seed)
    data = []
    for seq in sequences:
        h, a = target_features(llm, seq)
        h, a = h.clone(), a.clone()  # (out of inference mode: autograd reads them)
        ids = torch.tensor(seq[1:])  # row i: token i + 1 with feature h_i
        data.append((ids, h[:-1], h[1:], a[1:]))  # regress h_{i+1}, classify a_{i+1}
    head = TrainableHead(llm)
    opt = torch.optim.AdamW([p for p in head.parameters()], lr=lr, weight_decay=0.0)
    t0 = time.perf_counter()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        ids, feats, want_h, want_a = data[step % len(data)]
        out = head(ids, feats)
        loss_h = F.smooth_l1_loss(out, want_h)
        logits = out @ head.head.T
        loss_a = F.cross_entropy(logits, want_a)
        loss = loss_h + ce_weight * loss_a
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            acc = float((logits.argmax(-1) == want_a).float().mean())
            log(f"step {step}: feature loss {loss_h.item():.4f}, token loss {loss_a.item():.3f}, "
                f"top-1 {acc:.3f} ({time.perf_counter() - t0:.0f} s)")
    return head


def measure_acceptance(model: str | None, head: str | Path, prompts: list[list[int]], max_tokens: int,
                       num_tokens: int = 3, topk: int = 1, **engine_kwargs) -> dict[str, float]:
    """Greedy generation with the head drafting (no back-off, so every step is measured):
    accepted / drafted tokens (a tree: accepted / its depth), tokens per verify step, and whether
    the output equals plain decoding (it must). ``topk`` > 1: tree drafts."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    spec = LLM(model=model, speculative_algorithm="eagle", speculative_model=str(head),
               num_speculative_tokens=num_tokens, speculative_eagle_topk=topk, speculative_min_acceptance=0.0,
               **engine_kwargs)
    t0 = time.perf_counter()
    got = [spec.generate([p], params)[0].token_ids for p in prompts]
    spec_s = time.perf_counter() - t0
    s = spec.engine.stats()
    del spec
    plain = LLM(model=model, **engine_kwargs)
    t0 = time.perf_counter()
    want = [plain.generate([p], params)[0].token_ids for p in prompts]
    plain_s = time.perf_counter() - t0
    return {"acceptance_rate": s.spec_accepted_tokens / max(1, s.spec_draft_tokens),
            "tokens_per_verify_step": (s.spec_accepted_tokens + s.spec_verify_steps) / max(1, s.spec_verify_steps),
            "identical": float(got == want), "speculative_s": spec_s, "plain_s": plain_s}


def run_cli(args) -> int:
    """The ``anycore train-draft`` command (flags in anycore/cli.py)."""
    kwargs = dict(dtype=args.dtype, kv_cache_gb=args.kv_cache_gb)
    llm = LLM(model=args.model, **kwargs)
    token_ids = llm.engine.tokenizer.encode(Path(args.text).read_text())
    n = args.sequences + args.eval_prompts
    seqs = build_sequences(llm, token_ids, n, args.prompt_len, args.gen_len, not args.from_text, args.seed)
    train_seqs, eval_seqs = seqs[: args.sequences], seqs[args.sequences :]
    print(f"training on {len(train_seqs)} sequences of {len(train_seqs[0])} tokens, {args.steps} steps")
    head = train(llm, train_seqs, args.steps, lr=args.lr, ce_weight=args.ce_weight, seed=args.seed)
    head.save(args.out)
    del llm, head
    print(f"wrote {args.out}")
    prompts = [s[: args.prompt_len] for s in eval_seqs]
    m = measure_acceptance(args.model, args.out, prompts, args.eval_tokens, args.num_speculative_tokens, **kwargs)
    print(f"held-out prompts: {len(prompts)} x {args.eval_tokens} tokens, k = {args.num_speculative_tokens}: "
          f"acceptance {m['acceptance_rate']:.3f}, {m['tokens_per_verify_step']:.2f} tokens per verify step, "
          f"output identical to plain decoding: {bool(m['identical'])}; wall {m['speculative_s']:.1f} s "
          f"vs {m['plain_s']:.1f} s plain")
    return 0 if m["identical"] else 1
