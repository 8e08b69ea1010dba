"""Frozen configuration dataclasses. argv is read only in cli.py; everything else takes these."""

from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, fields, replace
from typing import Any

import torch

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        if name not in (torch.float32, torch.bfloat16):
            raise ValueError(f"unsupported dtype {name}; use float32 or bfloat16")
        return name
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}; use one of {sorted(set(_DTYPES))}") from None


@dataclass(frozen=True)
class MoEConfig:
    """The sparse MLP of a Mixture-of-Experts model (Qwen2/Qwen3-MoE, Mixtral, OLMoE).

    Routing is the same for all four: softmax over every expert's router logit (fp32), the
    ``top_k`` largest, renormalised to sum to one when ``norm_topk_prob`` (Mixtral always)."""

    num_experts: int
    top_k: int
    expert_intermediate_size: int
    norm_topk_prob: bool
    moe_layers: tuple[int, ...]  # the layers whose MLP is sparse; the others are dense SwiGLU
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: a dense expert every token runs, sigmoid-gated

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"num_experts_per_tok {self.top_k} must be in [1, num_experts={self.num_experts}]")


# HF architecture -> (key of the expert count, key of the expert MLP width, norm_topk_prob default)
_MOE_ARCHS = {
    "Qwen3MoeForCausalLM": ("num_experts", "moe_intermediate_size", False),
    "Qwen2MoeForCausalLM": ("num_experts", "moe_intermediate_size", False),
    "MixtralForCausalLM": ("num_local_experts", "intermediate_size", True),
    "OlmoeForCausalLM": ("num_experts", "intermediate_size", False),
}


def _moe_config(arch: str, hf: dict[str, Any]) -> MoEConfig | None:
    if arch not in _MOE_ARCHS:
        return None
    count_key, width_key, norm_default = _MOE_ARCHS[arch]
    # (transformers >= 5 writes Qwen3-MoE's expert count as num_local_experts)
    num_experts = hf.get(count_key) or hf.get("num_experts") or hf.get("num_local_experts")
    layers = range(hf["num_hidden_layers"])
    if arch.startswith("Qwen"):  # dense layers: mlp_only_layers, and all but every decoder_sparse_step-th
        step, dense = hf.get("decoder_sparse_step", 1) or 1, set(hf.get("mlp_only_layers") or ())
        moe_layers = tuple(i for i in layers if i not in dense and num_experts > 0 and (i + 1) % step == 0)
    else:
        moe_layers = tuple(layers)
    return MoEConfig(
        num_experts=num_experts,
        top_k=hf["num_experts_per_tok"],
        expert_intermediate_size=hf[width_key],
        # Mixtral renormalises unconditionally (its config has no such key)
        norm_topk_prob=True if arch == "MixtralForCausalLM" else bool(hf.get("norm_topk_prob", norm_default)),
        moe_layers=moe_layers,
        shared_expert_intermediate_size=int(hf.get("shared_expert_intermediate_size") or 0)
        if arch == "Qwen2MoeForCausalLM" else 0,
    )


_QKV_BIAS = ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM", "MiMoForCausalLM")  # bias on q/k/v when config.json does not say


@dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters, normalised from an HF config.json or GGUF metadata."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q/k/v projections
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before RoPE
    # OLMoE: the q/k RMSNorm is over the whole q (k) projection, not per head
    qk_norm_full: bool = False
    clip_qkv: float | None = None  # OLMoE: q, k, v clamped to [-clip, clip] after the projections
    moe: MoEConfig | None = None  # None: a dense model
    rope_scaling: dict[str, Any] | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # Gemma 3 (read from the config only for that architecture; the defaults mean "not used"):
    # per layer, the sliding window (keys a query sees, itself included) or None for a global
    # layer; () = every layer global
    layer_sliding_windows: tuple[int | None, ...] = ()
    rope_local_theta: float | None = None  # RoPE base of the sliding layers (no scaling there)
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (else head_dim)
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        archs = hf.get("architectures") or []
        if not archs:
            raise ValueError("config.json has no 'architectures' entry; cannot pick a model class")
        num_heads = hf["num_attention_heads"]
        hidden = hf["hidden_size"]
        arch = archs[0]
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        rope_scaling = hf.get("rope_scaling")
        rope_theta = hf.get("rope_theta")
        params = hf.get("rope_parameters")  # transformers >= 5 folds theta and scaling here
        if isinstance(params, dict):
            rope_theta = rope_theta or params.get("rope_theta")
            if params.get("rope_type", "default") != "default":
                rope_scaling = params
        kw: dict[str, Any] = dict(
            architecture=arch,
            vocab_size=hf["vocab_size"],
            hidden_size=hidden,
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hidden // num_heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta or 10000.0),
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=bool(hf.get("attention_bias", hf.get("qkv_bias", arch in _QKV_BIAS))),
            qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "OlmoeForCausalLM"),
            qk_norm_full=arch == "OlmoeForCausalLM",
            clip_qkv=hf.get("clip_qkv"),
            moe=_moe_config(arch, hf),
            rope_scaling=rope_scaling,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )
        if arch == "Gemma3ForCausalLM":
            kw.update(_gemma3_fields(hf))
        return cls(**kw)


def gemma3_layer_types(hf: dict[str, Any]) -> list[str]:
    """``layer_types`` as Gemma3TextConfig derives it: given, or every ``sliding_window_pattern``-th
    layer (default 6) global and the rest sliding."""
    types = hf.get("layer_types")
    if types:
        return list(types)
    pattern = int(hf.get("sliding_window_pattern") or 6)
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(hf["num_hidden_layers"])]


def _gemma3_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's extra hyper-parameters, from either config layout: transformers 5's
    ``rope_parameters`` per layer type, or the older flat ``rope_theta`` / ``rope_local_base_freq``
    / ``rope_scaling`` (which applies to the global layers only)."""
    if hf.get("use_bidirectional_attention"):
        raise ValueError("Gemma 3 with use_bidirectional_attention is not supported (causal decoding only)")
    if hf.get("attn_logit_softcapping"):
        # Gemma 2 capped attention scores; transformers' Gemma 3 reads the field but never applies
        # it (nor does llama.cpp): refused rather than guessing which of the two the file means
        raise ValueError("Gemma 3 with attn_logit_softcapping is not supported (transformers' Gemma 3 ignores it)")
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if act != "gelu_pytorch_tanh":
        raise ValueError(f"Gemma 3 with hidden_activation {act!r} is not supported (gelu_pytorch_tanh only)")
    window = hf.get("sliding_window")
    types = gemma3_layer_types(hf)
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if unknown:
        raise ValueError(f"unsupported Gemma 3 layer types {unknown}")
    if "sliding_attention" in types and not window:
        raise ValueError("Gemma 3 config has sliding layers but no sliding_window")
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and ("full_attention" in params or "sliding_attention" in params):
        full = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
        theta = float(full.get("rope_theta") or hf.get("rope_theta") or 1_000_000.0)
        scaling = full if full.get("rope_type", "default") != "default" else None
        local_theta = float(local.get("rope_theta") or hf.get("rope_local_base_freq") or 10_000.0)
        if local.get("rope_type", "default") != "default":
            raise ValueError("RoPE scaling on Gemma 3's sliding layers is not supported")
    else:
        theta = float(hf.get("rope_theta") or 1_000_000.0)
        scaling = hf.get("rope_scaling")
        local_theta = float(hf.get("rope_local_base_freq") or 10_000.0)
    return dict(
        rope_theta=theta,
        rope_scaling=scaling,
        rope_local_theta=local_theta,
        layer_sliding_windows=tuple(int(window) if t == "sliding_attention" else None for t in types),
        query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar") or 256),
        final_logit_softcapping=hf.get("final_logit_softcapping"),
        qk_norm=True,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
    )


# Greedy tokens per native call for offline callers (EngineConfig.for_offline). SmolLM2-135M's
# shipped Q4_1 file, batch-1 greedy decode of 128 tokens, bursts interleaved in one process, 6
# rounds each, 2-core AMD EPYC Zen 3: medians 132.1 / 144.8 / 146.6 tok/s for bursts of 1 / 4 /
# 16, and in a later, slower run 117.4 / 125.9 / 125.9 for 1 / 8 / 16, the same tokens every
# time. Eight keeps nearly all of it, and bounds the work an EOS or stop string wastes (the
# tokens after it in the same call) at 7 tokens; a max_tokens stop wastes none (the scheduler
# plans at most the tokens a request has left).
OFFLINE_DECODE_BURST = 8


def _env_float(name: str) -> float | None:
    value = os.environ.get(name)
    return float(value) if value else None


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs besides the model files."""

    model: str | None = None  # path to a GGUF file or an HF folder; None = the default model
    dtype: str = "bfloat16"
    # KV pool budget in GiB; env ANYCORE_KV_CACHE_GB overrides the default (not an explicit value)
    kv_cache_gb: float | None = None
    max_model_len: int | None = None  # default: the model's context length
    max_num_seqs: int = 64  # running requests per step
    max_num_batched_tokens: int = 512  # token budget per step (= prefill chunk size)
    policy: str = "fcfs"  # or "lpm" (longest prefix match first)
    enable_prefix_caching: bool = True
    threads: int | None = None
    # decode steps use fewer than `threads` when that measures faster (other processes on the
    # cores; anycore/engine/thread_governor.py); False pins the count
    adaptive_threads: bool = True
    # greedy tokens a request decoding alone with plain greedy sampling runs in one native call
    # (embedding, stack, head and argmax per token; no sampler, no Python between them;
    # Scheduler.update applies the stop conditions token by token, so outputs are the same).
    # 1: one token per call, so a stream gets every token as it is made; 0: never (every step
    # through the runner's batch and sampler). A request arriving meanwhile waits at most this
    # many tokens' time (Scheduler.schedule(max_steps), engine/native_executor.py).
    # None (default): 1 where tokens are streamed (the server, an Engine used directly), and
    # OFFLINE_DECODE_BURST for offline callers, which stream nothing (the LLM API and the offline
    # benchmarks, through for_offline()): like vLLM's multi-step scheduling, the Python step
    # between tokens runs once a burst
    decode_burst: int | None = None
    kernels: str | None = None  # override string for the kernel table, e.g. "torch-native"
    # None (auto): a GGUF file's quantized projections, embedding table and logits head run in
    # their own blocks ("gguf") when the dtype is bfloat16, other checkpoints as they say;
    # "none": dequantized / dense weights; "w8a8_int8" (online); pre-quantized checkpoints say so
    # themselves
    quantization: str | None = None
    # online quantization only: the logits head too (int8, smoothed; +0.2% perplexity on
    # SmolLM2-135M, a quarter of a bf16 decode step's bytes there); off by default
    quantize_lm_head: bool = False
    # online quantization only: the token embedding table too (int8 rows; a tied table needs
    # quantize_lm_head, since a float head would keep it); off by default
    quantize_embedding: bool = False
    # speculative decoding (anycore/spec/): None off; "ngram" drafts by prompt lookup, "draft"
    # with a small model (speculative_model / speculative_draft_layers); the target verifies 1 + k tokens per step, losslessly (greedy: the same tokens; sampling: the
    # same distribution). A request with a draft verifies it instead of taking the native
    # greedy decode (decode_burst); without one it decodes as usual
    speculative_algorithm: str | None = None
    # draft tokens per verify step (k); up to 15: a verify of at most 16 rows (8 on x86 with
    # AMX-BF16) runs the native bf16 GEMV (native_linear_max_rows, csrc/common/decoder_layout.h),
    # more fall to oneDNN
    num_speculative_tokens: int = 3
    ngram_prompt_lookup_max: int = 4  # the longest context suffix matched
    ngram_prompt_lookup_min: int = 2  # the shortest
    # running requests above which (seeded samplers excepted) nobody speculates: a big batch is
    # no longer bandwidth-bound, so verifying rejected drafts costs real compute
    speculative_max_batch: int = 4
    # a request whose accepted fraction of draft tokens (EWMA) falls below this backs off for a
    # growing number of steps
    speculative_min_acceptance: float = 0.3
    # speculative_algorithm "draft": a small checkpoint sharing the target's vocabulary, or
    # the target's own first N layers (plus its final norm and head) as a self-draft;
    # "eagle" / "eagle3": speculative_model is an EAGLE head's HF folder; "mtp": none (the
    # target checkpoint's own multi-token-prediction layer drafts)
    speculative_model: str | None = None
    speculative_draft_layers: int | None = None
    # ---- tensor parallel (anycore/distributed/) ----
    # ranks the model is sharded over (rank 0 here schedules and samples; the others are
    # processes it starts, or other nodes' `--node-rank` processes); nnodes hosts split them evenly
    tensor_parallel_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None  # HOST:PORT of rank 0's rendezvous (needed with nnodes > 1)
    dist_timeout: float = 120.0  # seconds a collective may wait before the engine fails (a hung rank)
    # the row-parallel all-reduce: "shm" (one host's shared memory, anycore/distributed/shm.py),
    # "gloo", or "auto" (shm when every rank is on one host and the op is available)
    dist_all_reduce: str = "auto"
    # eagle / eagle3 / mtp: > 1 drafts a tree (top-k branching, num_speculative_tokens levels deep),
    # verified with tree attention (greedy, or tree rejection sampling when sampled); 1: a chain
    speculative_eagle_topk: int = 1

    def speculative_config(self):  # -> anycore.spec.policy.SpeculativeConfig | None
        """The speculative decoding settings (validated), or None when it is off."""
        if self.speculative_algorithm is None:
            return None
        from anycore.spec.policy import SpeculativeConfig

        return SpeculativeConfig(self.speculative_algorithm, self.num_speculative_tokens,
                                 self.ngram_prompt_lookup_max, self.ngram_prompt_lookup_min,
                                 self.speculative_max_batch, self.speculative_min_acceptance,
                                 self.speculative_model, self.speculative_draft_layers,
                                 self.speculative_eagle_topk)

    @property
    def burst(self) -> int:
        """decode_burst as the engine runs it (unset: 1, every token streamed as it is made)."""
        return 1 if self.decode_burst is None else self.decode_burst

    def for_offline(self) -> EngineConfig:
        """This config for a caller that streams nothing: an unset decode_burst becomes
        OFFLINE_DECODE_BURST (an explicit one, 1 or 0 included, stays)."""
        return self if self.decode_burst is not None else replace(self, decode_burst=OFFLINE_DECODE_BURST)

    def resolved_kv_cache_gb(self) -> float:
        if self.kv_cache_gb is not None:
            return self.kv_cache_gb
        return _env_float("ANYCORE_KV_CACHE_GB") or 1.0

    def __post_init__(self) -> None:
        parse_dtype(self.dtype)
        if self.policy not in ("fcfs", "lpm"):
            raise ValueError(f"unknown scheduling policy {self.policy!r}; use 'fcfs' or 'lpm'")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.decode_burst is not None and self.decode_burst < 0:
            raise ValueError("decode_burst must be >= 0")
        if self.kv_cache_gb is not None and self.kv_cache_gb <= 0:
            raise ValueError("kv_cache_gb must be > 0")
        if self.quantize_lm_head and self.quantization in (None, "none"):
            raise ValueError("quantize_lm_head needs online quantization (quantization='w8a8_int8')")
        if self.quantize_embedding and self.quantization in (None, "none"):
            raise ValueError("quantize_embedding needs online quantization (quantization='w8a8_int8')")
        self.speculative_config()  # (raises on a bad speculative setting)
        self._check_parallel()

    def _check_parallel(self) -> None:
        tp, nodes = self.tensor_parallel_size, self.nnodes
        if tp < 1 or nodes < 1 or tp % nodes:
            raise ValueError("tensor_parallel_size must be a multiple of nnodes (both >= 1)")
        if not 0 <= self.node_rank < nodes:
            raise ValueError(f"node_rank must be in [0, {nodes})")
        if nodes > 1 and not self.dist_init_addr:
            raise ValueError("nnodes > 1 needs dist_init_addr (HOST:PORT of node 0)")
        if tp > 1 and (self.quantization not in (None, "none")
                       or self.speculative_algorithm in ("draft", "eagle", "eagle3", "mtp")):
            raise ValueError("tensor parallel runs dense weights without a draft model (no quantization, "
                             "no speculative_algorithm 'draft', 'eagle', 'eagle3' or 'mtp') for now")
        if self.dist_timeout <= 0:
            raise ValueError("dist_timeout must be > 0")
        if self.dist_all_reduce not in ("auto", "shm", "gloo"):
            raise ValueError(f"dist_all_reduce must be auto, shm or gloo, got {self.dist_all_reduce!r}")


# the names of server/tool_parsers/'s parsers, plus "auto" (kept here: config imports no server code)
TOOL_CALL_PARSERS = ("auto", "hermes", "llama3_json")


@dataclass(frozen=True)
class ServerConfig:
    """Everything `anycore serve` needs besides the engine (the CLI's defaults are these)."""

    host: str = "127.0.0.1"  # interface to bind (0.0.0.0 for all)
    port: int = 8000
    api_key: str | None = None  # when set, API routes require 'Authorization: Bearer <key>'
    served_model_names: tuple[str, ...] = ()  # names clients may send; () = the model file/folder name
    # admitted sub-requests without a first token beyond which new requests get 429; None = no limit
    max_queued_requests: int | None = 256
    shutdown_timeout: float = 10.0  # seconds in-flight requests may run on after SIGINT/SIGTERM
    max_request_body_mb: float = 4.0  # larger request bodies get 413 (0: no limit)
    request_timeout: float = 600.0  # seconds a request may take end to end (0: no limit); server/limits.py
    # time a few decode steps before serving and log them against the probed read bandwidth
    # (engine/self_check.py), so a process stuck in a slow mode says so
    self_check: bool = True
    uvicorn_log_level: str = "warning"
    # an `anycore bench compare --json` file the web page shows (GET /v1/bench); None: no Benchmarks tab
    bench_results: str | None = None
    # how tool calls are read from the output (server/tool_parsers/): "auto" picks by the chat template
    tool_call_parser: str = "auto"

    def __post_init__(self) -> None:
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(f"tool_call_parser must be one of {list(TOOL_CALL_PARSERS)}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is not in [0, 65535]")
        if self.max_queued_requests is not None and self.max_queued_requests < 1:
            raise ValueError("max_queued_requests must be >= 1 (or None for no limit)")
        if self.shutdown_timeout < 0:
            raise ValueError("shutdown_timeout must be >= 0")
        if self.max_request_body_mb < 0 or self.request_timeout < 0:
            raise ValueError("max_request_body_mb and request_timeout must be >= 0 (0: no limit)")


def default_of(cls: type, name: str) -> Any:
    """The default a config dataclass declares for field ``name`` (the CLI reads its defaults here)."""
    for f in fields(cls):
        if f.name == name:
            if f.default is MISSING:
                raise KeyError(f"{cls.__name__}.{name} has no plain default")
            return f.default
    raise KeyError(f"{cls.__name__} has no field {name!r}")
