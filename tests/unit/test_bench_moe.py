"""`anycore bench moe`'s random checkpoint: the parameter counts it reports are the checkpoint's,
and the engine's per-token decode bytes count exactly the active experts."""

from __future__ import annotations

from anycore.bench.moe import MoeShape, write_random_moe


def test_random_moe_counts_match_the_checkpoint_and_the_engine(tmp_path):
    from safetensors import safe_open

    from anycore.config import EngineConfig
    from anycore.engine.engine import Engine

    shape = MoeShape(hidden=64, layers=2, heads=16, kv_heads=4, experts=8, top_k=3, expert_inter=16)
    folder = write_random_moe(tmp_path / "m", shape)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        stored = sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())
    engine = Engine(EngineConfig(model=str(folder), dtype="bfloat16", kv_cache_gb=0.01))
    total, active = shape.params(engine.model_config.vocab_size)
    assert stored == total
    assert engine.model_config.moe.top_k == 3
    assert engine.weight_bytes == 2 * active  # bf16; tied embedding read once, as the head


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
