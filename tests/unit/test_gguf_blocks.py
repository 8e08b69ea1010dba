"""GGUFLinearMethod: a projection keeps the file's blocks when every shard comes in one block type
the kernels run, and falls back to dense weights (dequantized) otherwise."""

from __future__ import annotations

import pytest
import torch

from anycore.kernels import gguf as G
from anycore.layers.linear import Linear
from anycore.layers.quant.gguf_blocks import GGUFBlocks, GGUFLinearMethod
from tests.kernels.test_gguf_linear import random_blocks


def _merged(dtype=torch.float32) -> Linear:
    return Linear(64, [8, 4], bias=True, dtype=dtype, method=GGUFLinearMethod())


def test_shards_in_one_block_type_stay_blocks():
    lin = _merged()
    a, b = random_blocks(8, 64, G.Q4_1), random_blocks(4, 64, G.Q4_1)
    lin.load("weight", GGUFBlocks(G.Q4_1, a), 0)
    lin.load("weight", GGUFBlocks(G.Q4_1, b), 1)
    lin.load("bias", torch.arange(8.0), 0)
    lin.load("bias", torch.arange(4.0), 1)
    lin.method.process_weights_after_loading(lin)
    assert lin.weight is None and lin.qtype == G.Q4_1 and torch.equal(lin.qweight, torch.cat([a, b]))
    x = torch.randn(3, 64)
    expected = G.gguf_linear_reference(x, torch.cat([a, b]), G.Q4_1, torch.cat([torch.arange(8.0), torch.arange(4.0)]))
    torch.testing.assert_close(lin(x), expected)
    assert lin.native_args() is None  # no kernel table bound: no native stack either


def test_mixed_shards_fall_back_to_dense():
    lin = _merged(torch.bfloat16)
    a = random_blocks(8, 64, G.Q4_1)
    dense = torch.randn(4, 64)
    lin.load("weight", GGUFBlocks(G.Q4_1, a), 0)
    lin.load("weight", dense, 1)  # e.g. a type without a block kernel, dequantized by the loader
    lin.load("bias", torch.zeros(8), 0)
    lin.load("bias", torch.zeros(4), 1)
    lin.method.process_weights_after_loading(lin)
    assert lin.method.name == "dense"
    expected = torch.cat([G.dequantize(a, G.Q4_1), dense]).to(torch.bfloat16)
    assert lin.weight.dtype == torch.bfloat16 and torch.equal(lin.weight, expected)


def test_wrong_shard_shape_is_an_error():
    lin = _merged()
    with pytest.raises(ValueError, match="shard 1"):
        lin.load("weight", GGUFBlocks(G.Q4_0, random_blocks(8, 64, G.Q4_0)), 1)
    with pytest.raises(ValueError, match="no online gguf"):
        GGUFLinearMethod(prequantized=False)


def test_mixed_q5_0_and_q8_0_shards_become_q8_0_exactly():
    """Gemma 3's QKV: Q5_0 q/k with a Q8_0 v. Q5_0 (and Q4_0) re-encode as Q8_0 without loss."""
    lin = Linear(64, [8, 4, 4], bias=False, dtype=torch.float32, method=GGUFLinearMethod())
    q, k, v = random_blocks(8, 64, G.Q5_0), random_blocks(4, 64, G.Q4_0), random_blocks(4, 64, G.Q8_0)
    for i, (t, b) in enumerate([(G.Q5_0, q), (G.Q4_0, k), (G.Q8_0, v)]):
        lin.load("weight", GGUFBlocks(t, b), i)
    lin.method.process_weights_after_loading(lin)
    assert lin.method.name == "gguf" and lin.qtype == G.Q8_0
    expected = torch.cat([G.dequantize(q, G.Q5_0), G.dequantize(k, G.Q4_0), G.dequantize(v, G.Q8_0)])
    assert torch.equal(G.dequantize(lin.qweight, G.Q8_0), expected)


def test_k_quant_mix_falls_back_to_dense():
    lin = Linear(256, [4, 4], bias=False, dtype=torch.float32, method=GGUFLinearMethod())
    lin.load("weight", GGUFBlocks(G.Q4_K, random_blocks(4, 256, G.Q4_K)), 0)
    lin.load("weight", GGUFBlocks(G.Q6_K, random_blocks(4, 256, G.Q6_K)), 1)
    lin.method.process_weights_after_loading(lin)
    assert lin.method.name == "dense"
