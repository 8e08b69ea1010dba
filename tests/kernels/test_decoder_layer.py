"""The fused native decoder layer and layer stack give bit-identical results to the unfused path.

csrc/common/decoder_layer.cpp composes the same kernels as anycore/models/llama.py does op by
op, whether called once per layer (decoder_layer) or once for all layers (decoder_stack), so
logits, sampled tokens and the KV pool must match exactly, for every Llama-family
variant (qkv bias, q/k norm, untied head), in fp32 and bf16, dense and W8A8, through chunked
prefill, prefix-cache hits and mixed prefill+decode batches.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from anycore import LLM, SamplingParams
from tests.models.test_tiny_models import _configs, write_checkpoint


def _set_mode(llm: LLM, mode: str, layer_fn=None, stack_fn=None) -> None:
    """"stack": one native call for all layers; "layer": one per layer; "off": op by op."""
    model = llm.engine.model
    model.ops = dataclasses.replace(model.ops, decoder_stack=stack_fn if mode == "stack" else None)
    model._stack = None
    for layer in model.layers:
        layer.ops = dataclasses.replace(layer.ops, decoder_layer=layer_fn if mode != "off" else None)
        layer._fused = None


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
def test_fused_layer_and_stack_are_bit_identical(tmp_path, tokenizer, name, dtype, quantization):
    write_checkpoint(tmp_path, name, tokenizer)
    results = {}
    for mode in ("stack", "layer", "off"):
        llm = LLM(model=str(tmp_path), dtype=dtype, kv_cache_gb=0.01, quantization=quantization)
        ops = llm.engine.ops
        if ops.decoder_layer is None or ops.decoder_stack is None:
            pytest.skip("no fused decoder layer here (extension unavailable or some op not native)")
        assert all(layer.fused_args(llm.engine.dtype) is not None for layer in llm.engine.model.layers)
        calls = {"layer": 0, "stack": 0}

        def counted(kind, fn, calls=calls):
            def call(*a):
                calls[kind] += 1
                return fn(*a)
            return call

        _set_mode(llm, mode, counted("layer", ops.decoder_layer), counted("stack", ops.decoder_stack))
        out = _run(llm)
        # each mode really ran its path (and only it)
        assert (calls["stack"] > 0) == (mode == "stack") and (calls["layer"] > 0) == (mode == "layer"), calls
        results[mode] = out, llm.engine.kv_pool.k.clone(), llm.engine.kv_pool.v.clone()

    (off, k_off, v_off) = results["off"]
    for mode in ("stack", "layer"):
        on, k_on, v_on = results[mode]
        assert torch.equal(on[0], off[0]), mode
        assert on[1] == off[1] and on[2] == off[2], mode
        assert torch.equal(k_on, k_off) and torch.equal(v_on, v_off), mode


def test_hooked_linear_runs_unfused(tmp_path, tokenizer):
    """Forward hooks (e.g. calibration statistics) must see every projection's input."""
    write_checkpoint(tmp_path, "qwen3-qk-norm", tokenizer)
    llm = LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01)
    if llm.engine.ops.decoder_layer is None:
        pytest.skip("no fused decoder layer here")
    llm.engine.score([1, 2, 3])  # builds and caches the fused stack: the hook must still invalidate it
    assert llm.engine.model._stack is not None
    seen = []
    handle = llm.engine.model.layers[1].mlp.down_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0].shape))
    try:
        assert llm.engine.model._fused_stack(torch.float32) is None  # one hooked layer: no stack
        assert llm.engine.model.layers[1].fused_args(torch.float32) is None
        assert llm.engine.model.layers[0].fused_args(torch.float32) is not None
        llm.engine.score([5, 6, 7, 8])
    finally:
        handle.remove()
    assert seen and seen[0][0] == 4
    assert llm.engine.model._fused_stack(torch.float32) is not None  # hook gone: one call again


def test_a_replaced_method_rebuilds_the_stack(tmp_path, tokenizer):
    """A projection given a new LinearMethod (what quantization does) must not keep running the
    weights the old stack captured: the stack is rebuilt at the next forward."""
    write_checkpoint(tmp_path, "mistral", tokenizer)
    llm = LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01)
    if llm.engine.ops.decoder_stack is None:
        pytest.skip("no fused decoder stack here")
    model = llm.engine.model
    llm.engine.score([1, 2, 3])
    old = model._stack
    assert old is not None and model._fused_stack(torch.float32) is old  # unchanged: reused
    proj = model.layers[1].mlp.down_proj
    proj.method = type(proj.method)()
    assert not old.valid()
    new = model._fused_stack(torch.float32)
    assert new is not None and new is not old
