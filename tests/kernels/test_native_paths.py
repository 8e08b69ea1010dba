"""The native layer stack gives bit-identical results to the op-by-op path.

csrc/common/decoder_layer.cpp composes the same kernels as anycore/models/llama.py does op by
op, in one call for all layers (the runner's NativeExecutor picks it), so logits, sampled
tokens and the KV pool must match exactly, for every Llama-family variant (qkv bias, q/k norm,
untied head), in fp32 and bf16, dense and W8A8, through chunked prefill, prefix-cache hits and
mixed prefill+decode batches. The executor's stack cache must follow hooks and replaced methods.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from anycore import LLM, SamplingParams
from tests.models.test_moe_models import _configs as moe_configs
from tests.models.test_moe_models import write_checkpoint as write_moe_checkpoint
from tests.models.test_tiny_models import _configs, write_checkpoint
from tests.native_support import skip_unless_native, stack_ops


def _set_mode(llm: LLM, mode: str, stack_fn=None) -> None:
    """"stack": one native call for all layers; "off": op by op."""
    native = llm.engine.runner.native
    native.enabled = mode == "stack"
    native.ops = dataclasses.replace(native.ops, decoder_stack=stack_fn)
    native._stack = None


def _run(llm: LLM):
    """Prompt logprobs, then a mixed batch: 3 prompts (one sharing a prefix) through a small
    token budget so prefill chunks and decodes share steps."""
    scores = llm.engine.score(list(range(3, 70)))
    prompts = [list(range(5, 45)), [9, 9, 9], list(range(5, 30)) + [77, 78]]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    llm.engine.scheduler.max_num_batched_tokens = 16
    outs = llm.generate(prompts, params)
    return scores, [o.outputs[0].token_ids for o in outs], [o.outputs[0].logprobs for o in outs]


@pytest.mark.parametrize("quantization", [None, "w8a8_int8"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(_configs()))
def test_native_stack_is_bit_identical(tmp_path, tokenizer, name, dtype, quantization):
    write_checkpoint(tmp_path, name, tokenizer)
    _compare_paths(tmp_path, dtype, quantization, stack_ops(quantization))


@pytest.mark.parametrize("quantization", [None, "w8a8_int8"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(moe_configs()))
def test_native_stack_runs_moe_layers_bit_identically(tmp_path, tokenizer, name, dtype, quantization):
    """Sparse layers in the stack's slots (router, fused_moe / fused_moe_w8a8 experts, Qwen2-MoE's
    gated shared expert, OLMoE's whole-projection q/k norms), dense layers between them."""
    write_moe_checkpoint(tmp_path, name, tokenizer)
    _compare_paths(tmp_path, dtype, quantization, stack_ops(quantization, moe=True))


@pytest.mark.parametrize("quantization", [None, "w8a8_int8"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_native_stack_clamps_olmoe_qkv_bit_identically(tmp_path, tokenizer, dtype, quantization):
    """OLMoE's clip_qkv (q, k after their whole-projection norms, and v clamped) in the stack,
    at a bound the random projections cross (their outputs reach ~±2)."""
    write_moe_checkpoint(tmp_path, "olmoe", tokenizer, clip_qkv=0.5)
    _compare_paths(tmp_path, dtype, quantization, stack_ops(quantization, moe=True))
    # the bound bites: the same weights unclipped score otherwise
    write_moe_checkpoint(tmp_path / "unclipped", "olmoe", tokenizer)
    ids = list(range(3, 40))
    clipped = LLM(model=str(tmp_path), dtype=dtype, kv_cache_gb=0.01).engine.score(ids)
    free = LLM(model=str(tmp_path / "unclipped"), dtype=dtype, kv_cache_gb=0.01).engine.score(ids)
    assert not torch.allclose(clipped.float(), free.float(), atol=1e-2)


def _compare_paths(tmp_path, dtype: str, quantization: str | None, needs: list[str]) -> None:
    results = {}
    for mode in ("stack", "off"):
        llm = LLM(model=str(tmp_path), dtype=dtype, kv_cache_gb=0.01, quantization=quantization)
        ops, native = llm.engine.ops, llm.engine.runner.native
        if ops.decoder_stack is None:
            pytest.skip("no native decoder stack here (extension unavailable or some op not native)")
        skip_unless_native(llm.engine, needs, "the native stack of this model")
        assert native.stack(llm.engine.dtype) is not None
        calls = [0]

        def counted(*a, fn=ops.decoder_stack, calls=calls):
            calls[0] += 1
            return fn(*a)

        _set_mode(llm, mode, counted)
        out = _run(llm)
        assert (calls[0] > 0) == (mode == "stack"), calls  # each mode really ran its path (and only it)
        results[mode] = out, llm.engine.kv_pool.k.clone(), llm.engine.kv_pool.v.clone()

    (off, k_off, v_off), (on, k_on, v_on) = results["off"], results["stack"]
    assert torch.equal(on[0], off[0])
    assert on[1] == off[1] and on[2] == off[2]
    assert torch.equal(k_on, k_off) and torch.equal(v_on, v_off)


def test_stack_slots_follow_the_extension_layout():
    """The executor fills each layer's weights in the order the extension declares, and the
    `linear` op and the native stack share the extension's GEMV row limit for this host."""
    from anycore.engine.native_executor import native_layout
    from anycore.kernels.dispatch import host_features, select_ops
    from anycore.kernels.ops import native_linear_max_rows

    if select_ops().decoder_stack is None:
        pytest.skip("no native decoder stack here")
    names, max_rows = native_layout()
    assert names[:4] == ("input_norm", "qkv.weight", "qkv.scale", "qkv.bias") and len(names) == 24
    assert names[16:] == ("router.weight", "experts.w13", "experts.w2", "experts.w13_scale", "experts.w2_scale",
                          "experts.routing", "shared_gate.weight", "clip_qkv")
    # csrc/common/decoder_layout.h: 16 rows, 8 on x86 hosts whose oneDNN has AMX-BF16 tiles
    assert max_rows == native_linear_max_rows() == (8 if host_features().has("amx_bf16") else 16)


def test_hooked_linear_runs_op_by_op(tmp_path, tokenizer):
    """Forward hooks (e.g. calibration statistics) must see every projection's input."""
    write_checkpoint(tmp_path, "qwen3-qk-norm", tokenizer)
    llm = LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01)
    native = llm.engine.runner.native
    if llm.engine.ops.decoder_stack is None:
        pytest.skip("no native decoder stack here")
    llm.engine.score([1, 2, 3])  # builds and caches the stack: the hook must still invalidate it
    assert native._stack is not None
    seen = []
    handle = llm.engine.model.layers[1].mlp.down_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0].shape))
    try:
        assert native.stack(torch.float32) is None  # one hooked layer: no stack
        llm.engine.score([5, 6, 7, 8])
    finally:
        handle.remove()
    assert seen and seen[0][0] == 4
    assert native.stack(torch.float32) is not None  # hook gone: one call again


def test_a_replaced_method_rebuilds_the_stack(tmp_path, tokenizer):
    """A projection given a new LinearMethod (what quantization does) must not keep running the
    weights the old stack captured: the stack is rebuilt at the next forward."""
    write_checkpoint(tmp_path, "mistral", tokenizer)
    llm = LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01)
    native = llm.engine.runner.native
    if llm.engine.ops.decoder_stack is None:
        pytest.skip("no native decoder stack here")
    llm.engine.score([1, 2, 3])
    old = native._stack
    assert old is not None and native.stack(torch.float32) is old  # unchanged: reused
    proj = llm.engine.model.layers[1].mlp.down_proj
    proj.method = type(proj.method)()
    assert not old.valid(torch.float32)
    new = native.stack(torch.float32)
    assert new is not None and new is not old


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tree_verify_runs_in_the_stack_bit_identically(tmp_path, tokenizer, dtype):
    """A speculative tree verify (several new tokens seeing each other through a mask) runs its
    attention as tree_attention inside the stack: the same tokens, logprobs and KV pool as op by
    op, and the stack really took the masked steps."""
    from tests.models.test_spec_tree import OracleTrees
    from tests.models.test_speculative import PROMPTS

    write_checkpoint(tmp_path, "llama-untied-llama3-rope", tokenizer)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
    reference = LLM(model=str(tmp_path), dtype=dtype, kv_cache_gb=0.01)
    expected = {tuple(p): o.outputs[0].token_ids for p, o in zip(PROMPTS, reference.generate(PROMPTS, params))}
    results = {}
    for mode in ("stack", "off"):
        llm = LLM(model=str(tmp_path), dtype=dtype, kv_cache_gb=0.01, speculative_algorithm="ngram")
        ops = llm.engine.ops
        if ops.decoder_stack is None:
            pytest.skip("no native decoder stack here (extension unavailable or some op not native)")
        skip_unless_native(llm.engine, stack_ops(None) + ["tree_attention"], "a tree verify in the native stack")
        masked = [0]

        def counted(*a, fn=ops.decoder_stack, masked=masked):
            masked[0] += len(a) > 15 and a[15] is not None
            return fn(*a)

        _set_mode(llm, mode, counted)
        oracle = OracleTrees(expected)
        llm.engine.scheduler.speculator = oracle
        outs = llm.generate(PROMPTS, params)
        assert oracle.calls > 0
        assert (masked[0] > 0) == (mode == "stack"), masked
        results[mode] = ([o.outputs[0].token_ids for o in outs], [o.outputs[0].logprobs for o in outs],
                         llm.engine.kv_pool.k.clone(), llm.engine.kv_pool.v.clone())
    (tok_on, lp_on, k_on, v_on), (tok_off, lp_off, k_off, v_off) = results["stack"], results["off"]
    assert tok_on == tok_off and lp_on == lp_off
    assert torch.equal(k_on, k_off) and torch.equal(v_on, v_off)
