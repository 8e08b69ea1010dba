"""The default model (SmolLM2-135M, Q4_1 GGUF) served in its own blocks (``quantization="gguf"``).

Loading keeps every projection, the embedding table and the logits head as the file's blocks
(never a float copy), rows un-permuted like the dequantized weights; next-token predictions stay
close to bf16 on the dequantized weights; the native decoder stack (decode team included) and
the native greedy bursts run the blocks bit-identically to op by op.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from anycore import LLM, SamplingParams
from anycore.kernels import gguf as G
from anycore.kernels.gguf import Q8_0, gguf_linear_torch
from anycore.layers.linear import Linear
from anycore.layers.quant import resolve_quantization
from anycore.layers.quant.gguf_blocks import GGUFBlocks
from anycore.loader.gguf_loader import open_gguf

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def llm_gguf():
    return LLM(dtype="bfloat16", quantization="gguf", kv_cache_gb=0.05)


def test_blocks_dequantize_to_the_loaded_weights(default_model_path):
    source = open_gguf(default_model_path)
    for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.down_proj"):
        full = f"model.layers.3.{name}.weight"
        blocks = source._blocks(full)
        assert isinstance(blocks, GGUFBlocks) and blocks.data.dtype == torch.uint8
        assert torch.equal(blocks.dequantize(torch.float32), source._weights(full, torch.float32)), name
    # norms are not projections: they load as tensors
    assert source._blocks("model.layers.3.input_layernorm.weight") is None


def test_every_projection_keeps_its_blocks(llm_gguf):
    engine = llm_gguf.engine
    linears = [m for m in engine.model.modules() if isinstance(m, Linear)]
    assert linears and all(m.method.name == "gguf" and m.weight is None for m in linears)
    assert all(m.qweight.dtype == torch.uint8 and G.file_type(m.qtype) == G.Q4_1 for m in linears)
    # interleaved by 16 rows exactly when the bound gguf_linear variant has a micro-kernel for
    # that type's interleaved layout (AVX-512 VNNI: Q4_0/Q4_1/Q8_0; AVX2: Q4_0/Q4_1)
    index = linears[0].kernels.native_index.get("gguf_linear")
    names = torch.ops.anycore.variant_kernels(index) if index is not None else []
    assert all(G.is_interleaved(m.qtype) == ("gguf_interleaved16_q4_1" in names) for m in linears)
    head = engine.model.lm_head
    assert G.is_interleaved(head.gguf_qtype) == ("gguf_interleaved16_q8_0" in names)
    assert G.file_type(head.gguf_qtype) == G.Q8_0
    # the blocks are smaller than a bf16 copy: 20 bytes per 32 weights instead of 64
    block_bytes = sum(m.qweight.numel() for m in linears)
    assert block_bytes == sum(m.out_features * m.in_features for m in linears) * 20 // 32
    assert engine.quantization == "gguf"


def test_next_token_predictions_close_to_bf16(llm_gguf):
    """Teacher-forced over prose written for this repo: the blocks' top-1 next token agrees with
    bf16 on the dequantized weights almost everywhere (int8 activations are the difference)."""
    bf16 = LLM(dtype="bfloat16", quantization="none", kv_cache_gb=0.05)
    text = (Path(__file__).parents[1] / "data" / "prose.txt").read_text(encoding="utf-8")
    ids = llm_gguf.tokenizer.encode(text)[:256]
    a = llm_gguf.engine.next_token_logprobs(ids)
    b = bf16.engine.next_token_logprobs(ids)
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    assert agree >= 0.85, agree
    # and the tokens' log-probabilities (perplexity's terms) stay close on average
    targets = torch.tensor(ids[1:])[:, None]
    diff = (a[:-1].gather(1, targets) - b[:-1].gather(1, targets)).abs().mean().item()
    assert diff < 0.1, diff


def test_native_stack_is_bit_identical_to_op_by_op(monkeypatch):
    # no prefix caching: a cached prompt would be prefilled as one row instead of six, and the
    # dense prefill (over 16 rows: dequantized blocks, oneDNN) rounds its sums in another order
    llm = LLM(dtype="bfloat16", quantization="gguf", kv_cache_gb=0.05, enable_prefix_caching=False)
    engine = llm.engine
    if engine.ops.decoder_stack is None or "gguf_linear" not in engine.ops.native_index:
        pytest.skip("no native decoder stack or gguf_linear kernel here")
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)
    prompt = [1, 504, 3458, 282, 4649, 314]
    before = torch.ops.anycore.decode_team_steps()
    native = llm.generate([prompt], params)[0].outputs[0]
    assert torch.ops.anycore.decode_team_steps() > before  # the decode team ran the blocks
    monkeypatch.setattr(engine.runner.native, "enabled", False)
    op_by_op = llm.generate([prompt], params)[0].outputs[0]
    assert native.token_ids == op_by_op.token_ids
    assert native.logprobs == op_by_op.logprobs


def test_table_and_head_keep_the_files_blocks(llm_gguf, default_model_path):
    """SmolLM2's tied token_embd is Q8_0 in the file: the head multiplies by those blocks and the
    table looks its rows up in the same tensor (one copy, no bf16 table); a looked-up row equals
    the dense loader's row, and the head's logits are gguf_linear's on those blocks."""
    model = llm_gguf.engine.model
    table, head = model.embed_tokens, model.lm_head
    assert G.file_type(head.gguf_qtype) == Q8_0 and table.gguf_qtype == head.gguf_qtype
    assert table.weight is None and table.gguf_rows is head.gguf_qweight
    dense = open_gguf(default_model_path)._weights("model.embed_tokens.weight", torch.bfloat16)
    ids = torch.tensor([[0, 1, 504], [49151, 7, 7]])
    assert torch.equal(table(ids), dense[ids])
    hidden = torch.randn(3, 20, dense.shape[1], dtype=torch.bfloat16)  # 60 rows: four slices of 16
    logits = head(hidden)
    assert logits.shape == (3, 20, dense.shape[0]) and logits.dtype == torch.float32
    flat = hidden.reshape(-1, dense.shape[1])
    expected = torch.cat([gguf_linear_torch(flat[r : r + 16].float(), head.gguf_qweight, head.gguf_qtype)
                          for r in range(0, flat.shape[0], 16)])
    torch.testing.assert_close(logits.reshape(-1, dense.shape[0]), expected, rtol=1e-4, atol=1e-3)
    # a row's logits do not depend on the rows that came with it
    assert torch.equal(head(hidden[1, 3:4]), logits[1, 3:4])
    # the decode step streams the Q8_0 table once (a tied head is not "only gathered from")
    assert llm_gguf.engine.weight_bytes >= head.gguf_qweight.numel()


def test_greedy_bursts_equal_single_steps_on_blocks():
    """decode_greedy (embedding rows dequantized from the blocks, the Q8_0 head) gives the tokens
    and KV of one-token steps."""
    prompt = [1, 504, 3458, 282, 4649, 314]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    runs = []
    for burst in (8, 0):
        llm = LLM(dtype="bfloat16", quantization="gguf", kv_cache_gb=0.02, decode_burst=burst,
                  enable_prefix_caching=False)
        if burst and not llm.engine.runner.native.can_decode_greedy():
            pytest.skip("no native decode burst here")
        out = llm.generate([prompt], params)[0].outputs[0]
        runs.append((out.token_ids, llm.engine.kv_pool.k.clone()))
    assert runs[0][0] == runs[1][0]
    assert torch.equal(runs[0][1], runs[1][1])


def test_gguf_needs_a_gguf_file():
    with pytest.raises(ValueError, match="not a GGUF file"):
        resolve_quantization("gguf", {}, "hf")
    assert resolve_quantization("gguf", {}, "gguf") == ("gguf", True)


def test_default_serves_a_quantized_gguf_in_its_blocks_in_bf16_only():
    bf16, fp32 = torch.bfloat16, torch.float32
    assert resolve_quantization(None, {}, "gguf", bf16, has_blocks=True) == ("gguf", True)
    # fp32 (the oracle's dtype), "none", a file without block types, an HF folder: dense
    assert resolve_quantization(None, {}, "gguf", fp32, has_blocks=True) == (None, False)
    assert resolve_quantization("none", {}, "gguf", bf16, has_blocks=True) == (None, False)
    assert resolve_quantization(None, {}, "gguf", bf16, has_blocks=False) == (None, False)
    assert resolve_quantization(None, {}, "hf", bf16) == (None, False)
    with pytest.raises(ValueError, match="cannot dequantize"):
        resolve_quantization("none", {"quantization_config": {"quant_method": "compressed-tensors"}}, "hf")


def test_default_model_runs_its_q4_1_blocks_by_default():
    engine = LLM(kv_cache_gb=0.05).engine  # no dtype, no quantization given
    assert engine.quantization == "gguf" and engine.dtype == torch.bfloat16
    assert {m.method.name for m in engine.model.modules() if isinstance(m, Linear)} == {"gguf"}
