"""`anycore bench moe`: a random-weight Mixture-of-Experts model of a realistic shape, batch-1
decode and prefill, anycore vs transformers on the same HF folder and vs llama.cpp on the same
weights as a GGUF at the same precision (bf16 vs F16, W8A8 vs Q8_0; anycore.bench.moe_gguf).

The model is a Qwen3-MoE (default: hidden 1024, 12 layers, 64 experts of width 384, top-8,
the default model's 49152-token vocabulary, tied embeddings: ~1.0B parameters, ~0.19B active
per token), written once into ``--cache-dir`` in bf16 (std 0.02 normal weights; the numbers
measure speed, not text). Decode is also given as a fraction of the bandwidth limit counted
with only the active experts' bytes (``Engine.weight_bytes``: top_k of every MoE layer's
experts, plus everything dense), the memory bandwidth measured on the spot.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from anycore.bench import checks
from anycore.bench.report import write_json_atomic
from anycore.config import EngineConfig


@dataclass(frozen=True)
class MoeShape:
    hidden: int = 1024
    layers: int = 12
    heads: int = 16
    kv_heads: int = 4
    experts: int = 64
    top_k: int = 8
    expert_inter: int = 384

    def params(self, vocab: int) -> tuple[int, int]:
        """(total, active per token) parameter counts."""
        head_dim = self.hidden // self.heads
        attn = self.hidden * head_dim * (2 * self.heads + 2 * self.kv_heads) + 2 * head_dim + 2 * self.hidden
        expert = 3 * self.hidden * self.expert_inter
        router = self.experts * self.hidden
        dense = vocab * self.hidden + self.layers * (attn + router) + self.hidden
        return dense + self.layers * self.experts * expert, dense + self.layers * self.top_k * expert


def add_moe_args(p: argparse.ArgumentParser) -> None:
    d = MoeShape()
    p.add_argument("--hidden", type=int, default=d.hidden)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--experts", type=int, default=d.experts)
    p.add_argument("--top-k", type=int, default=d.top_k)
    p.add_argument("--expert-inter", type=int, default=d.expert_inter, help="each expert's MLP width")
    p.add_argument("--prompt-len", type=int, default=256, help="prefill prompt length (default 256)")
    p.add_argument("--decode-tokens", type=int, default=32, help="batch-1 decode tokens per run (default 32)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--quantization", default=None, choices=["w8a8_int8"], help="anycore only (default bf16)")
    p.add_argument("--no-transformers", action="store_true", help="leave transformers out")
    p.add_argument("--no-llama-cpp", action="store_true",
                   help="leave llama.cpp out (else: the checkpoint as an F16 GGUF, Q8_0 for --quantization w8a8_int8)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--cache-dir", default=str(Path.home() / ".cache/anycore/bench-moe"),
                   help="where the random checkpoint is written once (a folder per shape)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file (a folder: moe.json)")


def write_random_moe(folder: Path, shape: MoeShape, seed: int = 0) -> Path:
    """The random checkpoint of ``shape`` (config.json, model.safetensors, the default model's
    tokenizer) in ``folder``; kept when already complete."""
    import torch
    from safetensors.torch import save_file

    from anycore.loader.default_model import default_model_path
    from anycore.loader.tokenizer import load_gguf_tokenizer

    if (folder / "model.safetensors").exists() and (folder / "config.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = load_gguf_tokenizer(default_model_path())
    vocab = len(tokenizer)
    h, hd = shape.hidden, shape.hidden // shape.heads
    g = torch.Generator().manual_seed(seed)

    def r(*size):
        return (torch.randn(*size, generator=g) * 0.02).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    w = {"model.embed_tokens.weight": r(vocab, h), "model.norm.weight": ones(h)}
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h),
              p + "self_attn.q_proj.weight": r(shape.heads * hd, h), p + "self_attn.k_proj.weight": r(shape.kv_heads * hd, h),
              p + "self_attn.v_proj.weight": r(shape.kv_heads * hd, h), p + "self_attn.o_proj.weight": r(h, shape.heads * hd),
              p + "self_attn.q_norm.weight": ones(hd), p + "self_attn.k_norm.weight": ones(hd),
              p + "mlp.gate.weight": r(shape.experts, h)}
        for e in range(shape.experts):
            q = f"{p}mlp.experts.{e}."
            w |= {q + "gate_proj.weight": r(shape.expert_inter, h), q + "up_proj.weight": r(shape.expert_inter, h),
                  q + "down_proj.weight": r(h, shape.expert_inter)}
    save_file(w, str(folder / "model.safetensors"), metadata={"format": "pt"})
    del w
    config = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": vocab, "hidden_size": h,
        "intermediate_size": 4 * h, "moe_intermediate_size": shape.expert_inter, "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads, "head_dim": hd,
        "num_experts": shape.experts, "num_experts_per_tok": shape.top_k, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "hidden_act": "silu",
        "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(str(folder))
    return folder


def _anycore_config(folder: Path, args: argparse.Namespace) -> EngineConfig:
    # W8A8: the logits head int8 too (quantize_lm_head), as llama.cpp's Q8_0 file has it
    return EngineConfig(model=str(folder), dtype="bfloat16", kv_cache_gb=0.25, threads=args.threads,
                        quantization=args.quantization, quantize_lm_head=args.quantization == "w8a8_int8")


def _anycore(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    from anycore.bench.offline import run_latency

    return run_latency(_anycore_config(folder, args), args.prompt_len, args.decode_tokens, args.repeats)


def _interleaved(folder: Path, gguf: Path, args: argparse.Namespace, threads: int) -> tuple[dict, dict]:
    """anycore and llama.cpp both loaded, measured in turns (prefill, decode; repeat by repeat,
    the same prompts): on a shared machine each ratio then compares runs under the same load."""
    from anycore.bench.moe_gguf import active_bytes
    from anycore.bench.peers.anycore_runner import AnycoreRunner
    from anycore.bench.peers.llama_cpp import LlamaCppRunner

    ours = AnycoreRunner("anycore", _anycore_config(folder, args))
    theirs = LlamaCppRunner(f"llama.cpp {gguf.stem}", gguf, threads)
    runs: dict[str, dict[str, list[float]]] = {"ours": {"prefill": [], "decode": []},
                                               "theirs": {"prefill": [], "decode": []}}
    try:
        for r in range(args.repeats):
            for key, runner in (("ours", ours), ("theirs", theirs)):
                runs[key]["prefill"].append(runner.prefill(args.prompt_len, random.Random(r)))
                runs[key]["decode"].append(runner.decode(args.decode_tokens, random.Random(1000 + r)))
    finally:
        theirs.close()
    out = {}
    for key in runs:
        p, d = runs[key]["prefill"], runs[key]["decode"]
        out[key] = {"prefill_tok_s": statistics.median(p), "prefill_runs": p, "decode_tok_s": statistics.median(d),
                    "decode_runs": d, "decode_ratio_runs": [a / b for a, b in zip(runs["ours"]["decode"], d)]}
    out["ours"] |= {"weight_bytes": ours.engine.weight_bytes, "kernels": dict(ours.engine.ops.choices),
                    "prompt_len": args.prompt_len, "decode_tokens": args.decode_tokens}
    out["theirs"] |= {"file": str(gguf), "active_bytes": active_bytes(gguf)}
    return out["ours"], out["theirs"]


def _transformers(folder: Path, args: argparse.Namespace, threads: int) -> dict[str, Any]:
    from anycore.bench.peers.transformers_runner import TransformersRunner

    runner = TransformersRunner("transformers bf16", folder, "bf16", threads)
    rng = random.Random(1)
    prefill = [runner.prefill(args.prompt_len, rng) for _ in range(args.repeats)]
    decode = [runner.decode(args.decode_tokens, rng) for _ in range(args.repeats)]
    return {"prefill_tok_s": statistics.median(prefill), "prefill_runs": prefill,
            "decode_tok_s": statistics.median(decode), "decode_runs": decode}


def _gguf(folder: Path, args: argparse.Namespace) -> Path | None:
    """The checkpoint as llama.cpp's file at anycore's precision (None, said why, if unavailable)."""
    from anycore.bench.moe_gguf import write_moe_gguf
    from anycore.bench.peers.base import PeerUnavailable, require
    from anycore.bench.peers.gguf_files import gguf_variant

    qtype = "Q8_0" if args.quantization == "w8a8_int8" else "F16"
    try:
        require("llama_cpp", "pip install -e .[bench]")
        t0 = time.perf_counter()
        path = gguf_variant(write_moe_gguf(folder, folder / "model.F16.gguf"), qtype, folder)
    except PeerUnavailable as e:
        print(f"llama.cpp unavailable: {e}")
        return None
    print(f"gguf {path} ({time.perf_counter() - t0:.0f}s)")
    return path


def _report_llama_cpp(lc: dict[str, Any], ours: dict[str, Any], limit: float, label: str, qtype: str,
                      prompt_len: int) -> None:
    lc_limit = limit * ours["weight_bytes"] / lc["active_bytes"]
    print(f"{'llama.cpp ' + qtype:<18} decode {lc['decode_tok_s']:6.2f} tok/s ({lc['decode_tok_s'] / lc_limit:.0%} of "
          f"its {lc_limit:.1f} tok/s limit: {lc['active_bytes'] / 1e6:.0f} MB active)   prefill({prompt_len}) "
          f"{lc['prefill_tok_s']:7.1f} tok/s")
    lc["decode_ratio"] = ours["decode_tok_s"] / lc["decode_tok_s"]
    lc["prefill_ratio"] = ours["prefill_tok_s"] / lc["prefill_tok_s"]
    print(f"{label} / llama.cpp {qtype}: decode {lc['decode_ratio']:.2f}x (per turn: "
          f"{', '.join(f'{r:.2f}' for r in lc['decode_ratio_runs'])}), prefill {lc['prefill_ratio']:.2f}x")


def run_moe_bench(args: argparse.Namespace) -> int:
    import os

    import torch

    from anycore.bench.hardware import memory_bandwidth
    from anycore.loader.default_model import default_model_path
    from anycore.loader.tokenizer import load_gguf_tokenizer

    for flag in ("hidden", "layers", "experts", "top_k", "expert_inter", "prompt_len", "decode_tokens", "repeats"):
        checks.at_least(getattr(args, flag), 1, "--" + flag.replace("_", "-"))
    if args.top_k > args.experts:
        raise checks.BenchArgumentError(f"--top-k {args.top_k} exceeds --experts {args.experts}")
    if args.hidden % 16:
        raise checks.BenchArgumentError("--hidden must be a multiple of 16 (16 heads)")
    checks.threads(args.threads)
    json_path = checks.output_file(args.json, "moe.json", "--json") if args.json else None
    cache = checks.creatable_dir(Path(args.cache_dir).expanduser(), "--cache-dir")
    shape = MoeShape(args.hidden, args.layers, 16, 4, args.experts, args.top_k, args.expert_inter)
    vocab = len(load_gguf_tokenizer(default_model_path()))
    total, active = shape.params(vocab)
    name = f"qwen3moe-h{shape.hidden}-l{shape.layers}-e{shape.experts}-k{shape.top_k}-i{shape.expert_inter}"
    print(f"model {name}: {total / 1e9:.2f}B parameters, {active / 1e9:.3f}B active per token (bf16)")
    t0 = time.perf_counter()
    folder = write_random_moe(cache / name, shape)
    print(f"checkpoint {folder} ({time.perf_counter() - t0:.0f}s)")
    threads = args.threads or torch.get_num_threads()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    bw = memory_bandwidth(threads, cache)
    gguf = None if args.no_llama_cpp else _gguf(folder, args)
    lc = None
    if gguf is None:
        ours = _anycore(folder, args)
    else:
        ours, lc = _interleaved(folder, gguf, args, threads)
    limit = bw["gb_s"] * 1e9 / ours["weight_bytes"]
    label = f"anycore {args.quantization or 'bf16'}"
    print(f"load average {load:.1f} on {os.cpu_count()} CPUs; read bandwidth {bw['gb_s']:.1f} GB/s ({threads} threads)")
    print(f"{label:<18} decode {ours['decode_tok_s']:6.2f} tok/s ({ours['decode_tok_s'] / limit:.0%} of the "
          f"{limit:.1f} tok/s limit: {ours['weight_bytes'] / 1e6:.0f} MB active weights/token)   "
          f"prefill({args.prompt_len}) {ours['prefill_tok_s']:7.1f} tok/s")
    result: dict[str, Any] = {"shape": asdict(shape), "params": total, "active_params": active, "load_average": load,
                              "bandwidth": bw, "decode_limit_tok_s": limit, "anycore": ours}
    if lc is not None:
        _report_llama_cpp(lc, ours, limit, label, "Q8_0" if args.quantization else "F16", args.prompt_len)
        result["llama_cpp"] = lc
    if not args.no_transformers:
        hf = _transformers(folder, args, threads)
        print(f"{'transformers bf16':<18} decode {hf['decode_tok_s']:6.2f} tok/s   prefill({args.prompt_len}) "
              f"{hf['prefill_tok_s']:7.1f} tok/s")
        result["transformers"] = hf
    result["load_average_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    if json_path is not None:
        write_json_atomic(result, json_path)
    return 0
