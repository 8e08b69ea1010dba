"""The W8A8 logits head (LogitsHead.quantize_int8): accuracy, smoothing, what memory it keeps."""

from __future__ import annotations

import torch

from anycore.kernels.int8 import REFERENCE_W8A8
from anycore.layers.embedding import LogitsHead, VocabEmbedding


def _head(tied: bool, vocab: int = 300, hidden: int = 64, seed: int = 0) -> LogitsHead:
    torch.manual_seed(seed)
    emb = VocabEmbedding(vocab, hidden, torch.float32)
    emb.weight.data.normal_(0, 0.05)
    head = LogitsHead(vocab, hidden, torch.float32, emb if tied else None)
    if not tied:
        head.weight.data.normal_(0, 0.05)
    return head


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got - ref).norm() / ref.norm())


def test_int8_head_is_close_to_float_and_returns_fp32():
    for tied in (True, False):
        head = _head(tied)
        x = torch.randn(5, 64)
        ref = head(x)
        float_weight = (head.tied_to.weight if tied else head.weight).detach().clone()
        head.quantize_int8(kernel=REFERENCE_W8A8)
        got = head(x)
        assert got.dtype == torch.float32 and got.shape == ref.shape
        assert _rel_err(got, ref) < 0.02
        if tied:  # the embedding keeps its float matrix for the lookups
            assert torch.equal(head.tied_to.weight, float_weight)
        else:  # an untied head keeps only the int8 copy
            assert head.weight is None and "weight" not in head.state_dict()


def test_smoothing_tames_an_outlier_channel():
    x = torch.randn(64, 64)
    x[:, 3] *= 60.0  # one channel sets every token's int8 scale
    errs = {}
    for smoothed in (False, True):
        head = _head(tied=True, seed=1)
        ref = head(x)
        head.quantize_int8(x.abs().amax(dim=0) if smoothed else None, kernel=REFERENCE_W8A8)
        errs[smoothed] = _rel_err(head(x), ref)
    assert errs[True] < 0.5 * errs[False], errs


def test_bf16_hidden_gives_fp32_logits():
    head = _head(tied=True)
    head.quantize_int8(kernel=REFERENCE_W8A8)
    out = head(torch.randn(2, 64).to(torch.bfloat16))
    assert out.dtype == torch.float32 and out.shape == (2, 300)
