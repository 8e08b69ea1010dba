"""`anycore bench moe`'s llama.cpp peer file: the random checkpoint as a qwen3moe GGUF holds the
checkpoint's tensors under llama.cpp's names (experts stacked), its active bytes count top_k
of E experts, and anycore reads it back as the same model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anycore.bench.moe import MoeShape, write_random_moe
from anycore.bench.moe_gguf import active_bytes, write_moe_gguf

SHAPE = MoeShape(hidden=64, layers=2, heads=16, kv_heads=4, experts=8, top_k=3, expert_inter=32)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(the HF folder, its GGUF), written once for the module."""
    tmp = tmp_path_factory.mktemp("moe-gguf")
    folder = write_random_moe(tmp / "m", SHAPE)
    return folder, write_moe_gguf(folder, tmp / "m.F16.gguf")


def test_gguf_holds_the_checkpoint_in_llama_cpp_layout(files):
    from gguf import GGUFReader
    from safetensors.torch import load_file

    folder, path = files
    hf = load_file(str(folder / "model.safetensors"))
    r = GGUFReader(str(path))
    tensors = {t.name: t for t in r.tensors}
    assert bytes(r.fields["general.architecture"].parts[-1]).decode() == "qwen3moe"
    assert r.fields["qwen3moe.expert_used_count"].contents() == 3
    assert len(r.fields["tokenizer.ggml.tokens"].data) == hf["model.embed_tokens.weight"].shape[0]

    def same(name: str, want: torch.Tensor) -> None:
        t = tensors[name]
        got = np.asarray(t.data, dtype=np.float32).reshape(want.shape)
        # bf16 -> f16: exact but for magnitudes in f16's subnormal range (< 6.1e-5)
        np.testing.assert_allclose(got, want.float().numpy(), rtol=0, atol=6e-8)

    same("blk.1.attn_q.weight", hf["model.layers.1.self_attn.q_proj.weight"])
    assert tensors["blk.1.attn_q.weight"].tensor_type.name == "F16"
    assert tensors["blk.0.ffn_gate_inp.weight"].tensor_type.name == "F32"
    same("blk.0.ffn_gate_inp.weight", hf["model.layers.0.mlp.gate.weight"])
    same("blk.1.ffn_down_exps.weight",
         torch.stack([hf[f"model.layers.1.mlp.experts.{e}.down_proj.weight"] for e in range(8)]))
    assert "output.weight" not in tensors  # tied: token_embd is the head

    expert_bytes = sum(t.n_bytes for t in r.tensors if "_exps." in t.name)
    dense = sum(t.n_bytes for t in r.tensors if "_exps." not in t.name)
    assert active_bytes(path) == dense + expert_bytes * 3 // 8


def test_anycore_reads_the_gguf_as_the_same_model(files, monkeypatch, tokenizer):
    from anycore import LLM, SamplingParams
    from anycore.loader import gguf_loader

    # (the file's vocabulary is the default model's: its tokenizer stands in, not converted again)
    monkeypatch.setattr(gguf_loader, "load_gguf_tokenizer", lambda path: tokenizer)
    folder, path = files
    ids = [5, 17, 33, 99, 4, 250, 7, 1000, 20000]
    a = LLM(model=str(folder), dtype="float32", kv_cache_gb=0.01)
    b = LLM(model=str(path), dtype="float32", kv_cache_gb=0.01)
    assert b.engine.model_config.moe.num_experts == 8
    torch.testing.assert_close(a.engine.next_token_logprobs(ids), b.engine.next_token_logprobs(ids),
                               atol=1e-3, rtol=1e-3)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    assert a.generate([ids], params)[0].token_ids == b.generate([ids], params)[0].token_ids
