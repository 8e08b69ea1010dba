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
