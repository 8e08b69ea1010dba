"""consolidate_weights: one block, same tensors, same values; shared storages left alone."""

from __future__ import annotations

import torch
from torch import nn

from anycore.engine.weight_arena import consolidate_weights
from tests.native_support import missing, stack_ops


class _Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(33, 7)  # odd sizes: every tensor must still start on a cache line
        self.b = nn.Linear(7, 5, bias=False)
        self.b.weight.requires_grad_(False)
        self.register_buffer("table", torch.randn(11, 3))
        self.register_buffer("missing", None)
        self.shared = torch.randn(4, 6)
        self.register_buffer("left", self.shared[:2])  # two views of one storage
        self.register_buffer("right", self.shared[2:])
        self.c = nn.Module()
        self.c.weight = self.b.weight  # the same parameter registered twice (a tied weight)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))) + self.table.sum()


def test_weights_move_into_one_aligned_block_keeping_identity_and_values():
    torch.manual_seed(0)
    model = _Toy()
    x = torch.randn(3, 33)
    expected = model(x)
    before = {name: (t, t.clone(), t.data_ptr()) for name, t in [*model.named_parameters(), *model.named_buffers()]}
    held = model.a.weight  # what a fused-call cache would hold

    moved = consolidate_weights(model)

    params = [*model.parameters(), *model.buffers()]
    assert all(isinstance(p, nn.Parameter) for p in model.parameters())
    assert held is model.a.weight
    assert model.c.weight is model.b.weight
    storages = {t.untyped_storage().data_ptr() for name, t in model.named_parameters()} | {
        model.table.untyped_storage().data_ptr()}
    assert len(storages) == 1, "every movable tensor shares the one block"
    for name, (t, value, ptr) in before.items():
        now = dict([*model.named_parameters(), *model.named_buffers()])[name]
        assert now is t and torch.equal(now, value), name
        if name in ("left", "right"):
            assert now.data_ptr() == ptr, "views of a shared storage stay where they are"
        else:
            assert now.data_ptr() != ptr and now.data_ptr() % 64 == 0, name
    assert moved >= sum(t.numel() * t.element_size() for t in params if t.data_ptr() not in (before["left"][2],
                                                                                            before["right"][2]))
    assert torch.equal(model(x), expected)


def test_an_engine_runs_from_the_block_with_unchanged_results(tmp_path, tokenizer, monkeypatch):
    """A tiny checkpoint through the engine (fused stack, W8A8 buffers included): greedy tokens
    are the same before and after consolidating (caches built before it see the moved weights),
    and a consolidated model has nothing left to move."""
    import anycore.engine.engine as engine_module
    from anycore import LLM, SamplingParams
    from tests.models.test_tiny_models import write_checkpoint

    path = tmp_path / "tiny"
    write_checkpoint(path, "qwen2-qkv-bias", tokenizer)
    prompts = [[5, 17, 42, 99, 3], [200, 1, 7]]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    for kw in ({}, {"quantization": "w8a8_int8", "quantize_lm_head": True}):
        monkeypatch.setattr(engine_module, "consolidate_weights", lambda model: 0)
        llm = LLM(model=str(path), dtype="bfloat16", kv_cache_gb=0.01, **kw)
        model = llm.engine.model
        # one prompt at a time too: batch-1 decode runs in the team, which caches raw pointers
        first = [o.token_ids for o in llm.generate(prompts, params)] + [llm.generate([p], params)[0].token_ids
                                                                           for p in prompts]
        stack = llm.engine.runner.native._stack
        if missing(llm.engine, stack_ops(kw.get("quantization"))):
            assert stack is None  # (op by op on this host: nothing cached to invalidate)
            assert consolidate_weights(model) > 0
        else:
            assert stack is not None and stack.valid(torch.bfloat16)
            assert consolidate_weights(model) > 0
            assert not stack.valid(torch.bfloat16), "moving the weights invalidates what the fused calls cached"
        tensors = [*model.parameters(), *model.buffers()]
        assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1, kw
        again = [o.token_ids for o in llm.generate(prompts, params)] + [llm.generate([p], params)[0].token_ids
                                                                           for p in prompts]
        assert again == first, kw
        assert consolidate_weights(model) == 0
        monkeypatch.undo()
        engine = LLM(model=str(path), dtype="bfloat16", kv_cache_gb=0.01, **kw).engine
        assert consolidate_weights(engine.model) == 0, "the engine consolidates at load"
