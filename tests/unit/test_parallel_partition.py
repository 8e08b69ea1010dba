"""Tensor-parallel partitions and settings, without processes: KV-group split (uneven where the
heads do not divide), vocab chunks, core placement, and the settings rejected up front."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from anycore.config import EngineConfig, ModelConfig
from anycore.distributed.group import parse_addr, placement, split_even
from anycore.layers.parallel import check_tensor_parallel, kv_head_range, vocab_range


def _group(rank: int, world: int):
    return SimpleNamespace(rank=rank, world=world)


def test_kv_groups_split_unevenly():
    # SmolLM2-135M: 3 KV heads at TP=2 -> 2 groups + 1 group
    assert [kv_head_range(3, _group(r, 2)) for r in range(2)] == [(0, 2), (2, 3)]
    assert [kv_head_range(8, _group(r, 3)) for r in range(3)] == [(0, 3), (3, 6), (6, 8)]
    with pytest.raises(ValueError, match="KV heads"):
        kv_head_range(2, _group(0, 4))


def test_split_even_covers_everything_once():
    for n, world in [(1536, 2), (101, 2), (7, 3), (5, 5)]:
        ranges = [split_even(n, world, r) for r in range(world)]
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        assert max(b - a for a, b in ranges) - min(b - a for a, b in ranges) <= 1


def test_vocab_chunks():
    assert [vocab_range(255, _group(r, 2)) for r in range(2)] == [(0, 128), (128, 255)]
    assert [vocab_range(49152, _group(r, 2)) for r in range(2)] == [(0, 24576), (24576, 49152)]


def test_placement_shares_cores():
    p = placement(1, 1, 2, 8)
    assert p.threads == 4 and p.rank == 1
    assert placement(0, 0, 1, None).threads >= 1


def test_parse_addr():
    assert parse_addr("127.0.0.1:29500") == ("127.0.0.1", 29500)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_addr("127.0.0.1")


@pytest.mark.parametrize("kwargs, match", [
    (dict(tensor_parallel_size=3, nnodes=2), "multiple of nnodes"),
    (dict(tensor_parallel_size=2, nnodes=2, node_rank=2, dist_init_addr="127.0.0.1:1"), "node_rank"),
    (dict(tensor_parallel_size=2, nnodes=2), "dist_init_addr"),
    (dict(tensor_parallel_size=2, quantization="w8a8_int8"), "dense weights"),
    (dict(tensor_parallel_size=2, dist_timeout=0), "dist_timeout"),
])
def test_bad_settings_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**kwargs)


def test_unsupported_models_rejected_before_start():
    base = dict(architecture="LlamaForCausalLM", vocab_size=256, hidden_size=64, intermediate_size=128,
                num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e4,
                max_position_embeddings=64)
    check_tensor_parallel(ModelConfig(**base), 2)
    with pytest.raises(ValueError, match="KV heads"):
        check_tensor_parallel(ModelConfig(**base), 4)
    with pytest.raises(ValueError, match="Gemma3ForCausalLM"):
        check_tensor_parallel(ModelConfig(**{**base, "architecture": "Gemma3ForCausalLM"}), 2)
