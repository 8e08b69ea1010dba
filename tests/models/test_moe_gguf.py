"""MoE GGUF files (llama.cpp's layout: experts stacked as ffn_{gate,up,down}_exps, the router as
ffn_gate_inp, Qwen2-MoE's shared expert as *_shexp, Mixtral as "llama" with experts and permuted
Q/K rows, OLMoE with its full-width q/k norms) written here from the random HF checkpoints of
test_moe_models, greedy vs transformers. (transformers' GGUF model reader has no olmoe: its
vocabulary is read by the fast tokenizer directly, checked below.)"""

from __future__ import annotations

import numpy as np
import pytest

from anycore import LLM, SamplingParams
from tests.models.hf_oracle import hf_greedy
from tests.models.test_moe_models import PROMPTS, write_checkpoint

# test config name -> GGUF architecture
ARCHS = {"qwen3-moe": "qwen3moe", "qwen2-moe-shared-expert": "qwen2moe", "mixtral": "llama", "olmoe": "olmoe"}
# what a GGUF cannot say (llama.cpp's graphs make every layer sparse)
ALL_SPARSE = {"qwen3-moe": dict(mlp_only_layers=[]), "qwen2-moe-shared-expert": dict(decoder_sparse_step=1)}
LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
         "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate": "ffn_gate_inp",
         "block_sparse_moe.gate": "ffn_gate_inp", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
         "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
         "mlp.shared_expert.down_proj": "ffn_down_shexp"}
EXPERT = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter permute(): rotate-half rows to interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, hf, folder, arch: str) -> None:
    """``folder``'s safetensors (per-expert tensors, as transformers saves them) as a GGUF."""
    import gguf
    from safetensors.torch import load_file

    c = hf.config
    w = gguf.GGUFWriter(str(path), arch)
    experts = getattr(c, "num_experts", None) or c.num_local_experts
    w.add_uint32(f"{arch}.vocab_size", c.vocab_size)
    for key, value in {"embedding_length": c.hidden_size, "feed_forward_length": c.intermediate_size,
                       "block_count": c.num_hidden_layers, "attention.head_count": c.num_attention_heads,
                       "attention.head_count_kv": c.num_key_value_heads, "context_length": 512,
                       "attention.key_length": c.head_dim if getattr(c, "head_dim", None) else
                       c.hidden_size // c.num_attention_heads,
                       "expert_count": experts, "expert_used_count": c.num_experts_per_tok}.items():
        w.add_uint32(f"{arch}.{key}", value)
    if getattr(c, "moe_intermediate_size", None):
        w.add_uint32(f"{arch}.expert_feed_forward_length", c.moe_intermediate_size)
    if getattr(c, "shared_expert_intermediate_size", None):
        w.add_uint32(f"{arch}.expert_shared_feed_forward_length", c.shared_expert_intermediate_size)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", c.rms_norm_eps)
    w.add_float32(f"{arch}.rope.freq_base", c.rope_parameters["rope_theta"])
    tensors, stacked = {}, {}
    for name, t in load_file(str(folder / "model.safetensors")).items():
        a = t.float().numpy()
        if name == "lm_head.weight":
            tensors["output.weight"] = a
            continue
        if name in ("model.embed_tokens.weight", "model.norm.weight"):
            tensors[{"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}[name]] = a
            continue
        _, _, layer, rest = name.split(".", 3)
        module, _, kind = rest.rpartition(".")
        if ".experts." in module:
            e, proj = module.split(".experts.")[1].split(".")
            stacked.setdefault((layer, EXPERT[proj]), {})[int(e)] = a
            continue
        if module == "mlp.shared_expert_gate":
            a = a.reshape(-1)
        if arch == "llama" and module == "self_attn.q_proj":
            a = _permute(a, c.num_attention_heads)
        if arch == "llama" and module == "self_attn.k_proj":
            a = _permute(a, c.num_key_value_heads)
        tensors[f"blk.{layer}.{LAYER[module]}.{kind}"] = a
    for (layer, proj), per_expert in stacked.items():
        tensors[f"blk.{layer}.ffn_{proj}_exps.weight"] = np.stack([per_expert[e] for e in range(experts)])
    for name, a in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_moe_gguf_matches_transformers(tmp_path, monkeypatch, tokenizer, name):
    from anycore.loader import gguf_loader

    # (no vocabulary in these files: the default model's tokenizer stands in, as in the HF folders)
    monkeypatch.setattr(gguf_loader, "load_gguf_tokenizer", lambda path: tokenizer)
    hf = write_checkpoint(tmp_path / "hf", name, tokenizer, **ALL_SPARSE.get(name, {}))
    path = tmp_path / "model.gguf"
    write_gguf(path, hf, tmp_path / "hf", ARCHS[name])
    llm = LLM(model=str(path), dtype="float32", kv_cache_gb=0.01)
    assert llm.engine.model_config.moe is not None
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == [hf_greedy(hf, p, 10) for p in PROMPTS]


def test_olmoe_gguf_vocabulary_is_read(tmp_path, default_model_path, tokenizer):
    """An olmoe file's vocabulary (here the default model's, copied) is read although
    transformers' GGUF model reader refuses the architecture."""
    import gguf

    from anycore.loader.tokenizer import load_gguf_tokenizer

    w = gguf.GGUFWriter(str(tmp_path / "vocab.gguf"), "olmoe")
    w.add_uint32("olmoe.block_count", 1)
    for key, field in gguf.GGUFReader(str(default_model_path)).fields.items():
        if key.startswith("tokenizer."):
            w.add_key_value(key, field.contents(), field.types[0], sub_type=field.types[1] if len(field.types) > 1 else None)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    text = "Hello world, this is a mixture of experts."
    assert load_gguf_tokenizer(tmp_path / "vocab.gguf").encode(text) == tokenizer.encode(text)
