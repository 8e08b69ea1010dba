"""quantize_embedding: the token embedding table as int8 rows (online quantization only)."""

from __future__ import annotations

import pytest
import torch

from anycore import LLM
from anycore.layers.embedding import VocabEmbedding
from tests.models.test_tiny_models import write_checkpoint


def test_int8_rows_look_up_within_half_a_step():
    torch.manual_seed(0)
    emb = VocabEmbedding(300, 48, torch.bfloat16)
    emb.weight.data.copy_(torch.randn(300, 48) * torch.rand(300, 1) * 3)
    table = emb.weight.data.float().clone()
    ids = torch.tensor([[0, 5, 299], [7, 7, 123]])
    emb.quantize_int8()
    assert emb.is_int8 and emb.weight is None and emb.qweight.dtype == torch.int8
    got = emb(ids)
    assert got.dtype == torch.bfloat16 and got.shape == (2, 3, 48)
    step = table.abs().amax(dim=1) / 127  # one int8 step of each row
    err = (got.float() - table[ids]).abs() / step[ids][..., None]
    assert err.max() <= 0.5 + 2 ** -7 * 127  # half a step, plus the bf16 rounding of the output


@pytest.mark.parametrize("smoothed", [False, True])
def test_a_tied_table_reads_its_rows_from_the_int8_head(smoothed):
    from anycore.kernels.int8 import REFERENCE_W8A8
    from anycore.layers.embedding import LogitsHead

    torch.manual_seed(0)
    emb = VocabEmbedding(300, 48, torch.float32)
    emb.weight.data.copy_(torch.randn(300, 48) * torch.rand(300, 1) * 3)
    table = emb.weight.data.clone()
    head = LogitsHead(300, 48, torch.float32, tied_to=emb)
    absmax = torch.rand(48) * 10 + 0.1 if smoothed else None
    head.quantize_int8(absmax, kernel=REFERENCE_W8A8)
    hidden = torch.randn(4, 48)
    logits = head(hidden)
    emb.share_int8_head(head)
    assert emb.is_int8 and emb.weight is None and not list(emb.buffers())
    ids = torch.tensor([[0, 5, 299], [7, 7, 123]])
    got = emb(ids)
    assert got.dtype == torch.float32 and got.shape == (2, 3, 48)
    # the head's own dequantized rows, scaled back by its smoothing
    rows = head.qweight_packed[ids].float() * head.w_scale[ids, None]
    if smoothed:
        rows = rows * head.inv_smooth
    assert torch.allclose(got, rows, rtol=1e-6, atol=0)
    assert (got - table[ids]).abs().max() < 0.1 * table.abs().max()
    assert torch.equal(head(hidden), logits)  # the head is untouched
    with pytest.raises(ValueError, match="tied"):
        VocabEmbedding(300, 48, torch.float32).share_int8_head(head)


@pytest.mark.parametrize("arch, kernels", [("llama-untied-llama3-rope", None), ("qwen2-qkv-bias", None),
                                           ("qwen2-qkv-bias", "torch-native")])
def test_engine_quantizes_the_table_and_leaves_it_out_of_streamed_bytes(tmp_path, tokenizer, arch, kernels):
    write_checkpoint(tmp_path, arch, tokenizer)
    kw = dict(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01, quantization="w8a8_int8",
              quantize_lm_head=True, kernels=kernels)
    ref = LLM(**kw).engine
    engine = LLM(**kw, quantize_embedding=True).engine
    emb = engine.model.embed_tokens
    assert emb.is_int8 and ref.model.embed_tokens.weight is not None
    assert engine.weight_bytes == ref.weight_bytes  # a gathered table is never streamed, float or int8

    def resident(model):
        return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])

    table = ref.model.embed_tokens.weight
    if engine.model.lm_head.tied_to is emb:  # rows read from the int8 head: no copy of its own
        assert emb.shared_head is engine.model.lm_head and not list(emb.buffers())
        assert engine.num_params == ref.num_params - table.numel()
        assert resident(ref.model) - resident(engine.model) == table.numel() * 4
    else:
        assert emb.shared_head is None
        assert engine.num_params == ref.num_params + emb.row_scale.numel()
        assert resident(ref.model) - resident(engine.model) == table.numel() * (4 - 1) - emb.row_scale.numel() * 4
    ids = list(range(3, 60))
    got, want = engine.score(ids), ref.score(ids)
    assert (got - want).abs().mean() < 0.05 * want.abs().mean()


def test_a_tied_table_needs_the_int8_head_and_online_quantization(tmp_path, tokenizer):
    from anycore.cli import main
    from anycore.config import EngineConfig

    with pytest.raises(ValueError, match="needs online quantization"):
        EngineConfig(quantize_embedding=True)
    write_checkpoint(tmp_path, "qwen2-qkv-bias", tokenizer)  # tied
    with pytest.raises(ValueError, match="needs quantize_lm_head"):
        LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01, quantization="w8a8_int8",
            quantize_embedding=True)
    assert main(["quantize", "--quantize-embedding", "--out", str(tmp_path / "q")]) == 2  # not in checkpoints
