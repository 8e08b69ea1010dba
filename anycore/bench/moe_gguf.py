"""llama.cpp as a peer of `anycore bench moe`: the benchmark's random Qwen3-MoE checkpoint written
as a GGUF (F16, llama.cpp's own layout), re-quantized by llama.cpp to Q8_0, timed in-process.

The file holds exactly the HF folder's weights: every tensor of the safetensors file under its
llama.cpp name (``qwen3moe``: attn_q/k/v/output, attn_q_norm/k_norm, ffn_gate_inp router, the
experts stacked as ffn_{gate,up,down}_exps ``[E, out, in]``), matrices in F16 (bf16 -> f16 is
exact at the checkpoint's 0.02-std weights), norms and the router in F32 (llama.cpp keeps them
so), and the default model's vocabulary (the checkpoint's tokenizer) copied from its GGUF.
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path
from typing import Any

# HF module (below model.layers.<i>.) -> llama.cpp tensor name (below blk.<i>.)
_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
          "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate": "ffn_gate_inp"}
_EXPERT = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
_F32 = ("_norm.weight", "ffn_gate_inp.weight")  # kept fp32, as llama.cpp's converter writes them


def write_moe_gguf(folder: Path, dst: Path) -> Path:
    """``folder`` (written by anycore.bench.moe.write_random_moe) as an F16 GGUF at ``dst``;
    kept when it exists."""
    import json

    import gguf
    import numpy as np
    from safetensors import safe_open

    from anycore.loader.default_model import default_model_path

    if dst.exists():
        return dst
    c = json.loads((folder / "config.json").read_text())
    arch = "qwen3moe"
    tmp = dst.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), arch)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, value in {"context_length": c["max_position_embeddings"], "embedding_length": c["hidden_size"],
                       "feed_forward_length": c["intermediate_size"], "block_count": c["num_hidden_layers"],
                       "attention.head_count": c["num_attention_heads"],
                       "attention.head_count_kv": c["num_key_value_heads"], "attention.key_length": c["head_dim"],
                       "attention.value_length": c["head_dim"], "expert_count": c["num_experts"],
                       "expert_used_count": c["num_experts_per_tok"],
                       "expert_feed_forward_length": c["moe_intermediate_size"]}.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", c["rms_norm_eps"])
    w.add_float32(f"{arch}.rope.freq_base", c["rope_theta"])
    vocab = gguf.GGUFReader(str(default_model_path()))
    for key, field in vocab.fields.items():
        if key.startswith("tokenizer."):
            sub = field.types[1] if len(field.types) > 1 else None
            w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    experts = c["num_experts"]
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = list(f.keys())

        def tensor(name: str) -> np.ndarray:
            return f.get_tensor(name).float().numpy()

        def add(name: str, a: np.ndarray) -> None:
            w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32 if name.endswith(_F32) else np.float16))

        add("token_embd.weight", tensor("model.embed_tokens.weight"))
        add("output_norm.weight", tensor("model.norm.weight"))
        for layer in range(c["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            for module, short in _LAYER.items():
                add(f"blk.{layer}.{short}.weight", tensor(p + module + ".weight"))
            for proj, short in _EXPERT.items():
                add(f"blk.{layer}.ffn_{short}_exps.weight",
                    np.stack([tensor(f"{p}mlp.experts.{e}.{proj}.weight") for e in range(experts)]))
        if "lm_head.weight" in names:
            add("output.weight", tensor("lm_head.weight"))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    tmp.rename(dst)
    return dst


def active_bytes(path: Path) -> int:
    """Bytes one batch-1 decode token streams from the file: every tensor except the token
    embedding when a separate output head exists, and top_k of E of each layer's experts."""
    from anycore.bench.peers.gguf_files import summary

    s = summary(path)
    k, e = s.ints["expert_used_count"], s.ints["expert_count"]
    tied = not any(t.name == "output.weight" for t in s.tensors)
    total = 0
    for t in s.tensors:
        if t.name == "token_embd.weight" and not tied:
            continue
        total += t.n_bytes * k // e if "_exps." in t.name else t.n_bytes
    return total


def run_llama_cpp(path: Path, threads: int, prompt_len: int, decode_tokens: int, repeats: int) -> dict[str, Any]:
    """Batch-1 decode and prefill of ``path`` in llama.cpp (medians over ``repeats``)."""
    from anycore.bench.peers.llama_cpp import LlamaCppRunner

    runner = LlamaCppRunner(f"llama.cpp {path.stem}", path, threads)
    try:
        rng = random.Random(1)
        prefill = [runner.prefill(prompt_len, rng) for _ in range(repeats)]
        decode = [runner.decode(decode_tokens, rng) for _ in range(repeats)]
    finally:
        runner.close()
    return {"file": str(path), "active_bytes": active_bytes(path),
            "prefill_tok_s": statistics.median(prefill), "prefill_runs": prefill,
            "decode_tok_s": statistics.median(decode), "decode_runs": decode}
