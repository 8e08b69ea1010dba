"""Tensor parallel (anycore/distributed/, anycore/layers/parallel.py): TP=2 fp32 greedy output is
token-identical to TP=1 (and to transformers) on random-weight checkpoints written here, whose
3 KV heads split unevenly (2 + 1 KV groups), on the default model, and as 2 nodes on loopback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from anycore import LLM, SamplingParams
from anycore.distributed import shm
from anycore.distributed.driver import free_loopback_port
from tests.models.hf_oracle import hf_greedy

# 6 query heads over 3 KV heads (TP=2: 2 groups + 1 group), an intermediate width that splits
# 51 + 50, a vocabulary that splits 128 + 127 (the last rank's logits padded for the gather)
COMMON = dict(vocab_size=255, hidden_size=96, intermediate_size=101, num_hidden_layers=2, num_attention_heads=6,
              num_key_value_heads=3, max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
PROMPTS = [[5, 17, 33, 99, 4, 250, 7], [9, 9, 9], list(range(10, 60))]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _configs():
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    return {
        "llama-untied": (LlamaConfig, dict(tie_word_embeddings=False)),
        "qwen2-qkv-bias-tied": (Qwen2Config, dict(tie_word_embeddings=True)),
        "qwen3-qk-norm": (Qwen3Config, dict(head_dim=16, tie_word_embeddings=True)),
    }


def write_tokenizer(folder) -> None:
    """A word-level tokenizer over the checkpoint's vocabulary (no default model needed: the
    emulated Arm64 lane has none)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, COMMON["vocab_size"])}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder)


def write_checkpoint(folder, name, num_kv_heads=3):
    """6 query heads over ``num_kv_heads`` KV heads (3: TP=2 splits them 2 + 1; 6: TP=4 2+2+1+1)."""
    from transformers import AutoModelForCausalLM

    cls, extra = _configs()[name]
    torch.manual_seed(0)
    config = cls(**{**COMMON, "num_key_value_heads": num_kv_heads}, **extra)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():  # larger than init so logits are not near-ties
            p.normal_(0, 0.2)
    model.save_pretrained(folder)
    write_tokenizer(folder)
    return model.eval()


def token_ids(llm: LLM, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, params)]


# The emulated Arm64 lane runs one of them, under one CPU model: 3 processes importing torch under
# QEMU cost ~2.5 min (load 9), and nothing in TP depends on the vector ISA.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.arm64) if n == "llama-untied" else n
                                  for n in sorted(_configs())])
def test_tp2_matches_tp1_and_transformers(tmp_path, name):
    if os.environ.get("QEMU_CPU", "neoverse-n1") != "neoverse-n1":
        pytest.skip("the Arm64 lane runs tensor parallel under QEMU_CPU=neoverse-n1 only")
    hf = write_checkpoint(tmp_path, name)
    tp1 = LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01)
    expected = token_ids(tp1)
    assert expected == [hf_greedy(hf, p, 12) for p in PROMPTS]
    prompt_lp = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=0, ignore_eos=True)
    ref_lps = tp1.generate(PROMPTS[2], prompt_lp)[0].prompt_logprobs
    tp2 = LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01, tensor_parallel_size=2)
    try:
        pool = tp2.engine.kv_pool
        assert pool.k.shape[2] == 2  # rank 0 holds 2 of the 3 KV heads
        # one host: the shared-memory all-reduce runs wherever an implementation exists (the
        # emulated Arm64 lane builds the extension, so there it is the native op)
        impl = shm.implementation()
        assert impl is not None or not os.environ.get("ANYCORE_ARM64_LANE")
        assert tp2.engine.parallel.group.all_reduce_name().startswith(f"shm ({impl[0]}" if impl else "gloo")
        assert token_ids(tp2) == expected
        tp2.engine.scheduler.max_num_batched_tokens = 4  # prefill chunked to 4 tokens per step
        assert token_ids(tp2) == expected
        # prompt logprobs (logits of every prompt position, gathered over the vocab shards)
        lps = tp2.generate(PROMPTS[2], prompt_lp)[0].prompt_logprobs
        assert [lp.token_id for lp in lps[1:]] == [lp.token_id for lp in ref_lps[1:]]
        for got, ref in zip(lps[1:], ref_lps[1:]):
            assert got.logprob == pytest.approx(ref.logprob, abs=1e-4)
            assert got.rank == ref.rank
    finally:
        tp2.close()


def test_tp2_bfloat16(tmp_path):
    """bf16 takes the native paths at TP=1 (stack, multi-step greedy); TP=2 runs op by op and
    its row-parallel sums round differently, so it is compared by agreement, not identity."""
    write_checkpoint(tmp_path, "qwen2-qkv-bias-tied")
    expected = token_ids(LLM(model=str(tmp_path), dtype="bfloat16", kv_cache_gb=0.01))
    tp2 = LLM(model=str(tmp_path), dtype="bfloat16", kv_cache_gb=0.01, tensor_parallel_size=2)
    try:
        assert not tp2.engine.runner.native.enabled
        got = token_ids(tp2)
    finally:
        tp2.close()
    assert [len(g) for g in got] == [12] * len(PROMPTS)
    assert [g[0] for g in got] == [e[0] for e in expected]


@pytest.mark.parametrize("tp", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_two_nodes_on_loopback(tmp_path, tp):
    """TP=2 as 2 nodes x 1 rank, and TP=4 as 2 nodes x 2 ranks (slow: 4 processes; each node
    starts its own local worker): node 1 is a separate `anycore generate --node-rank 1` process
    reaching node 0 over TCP on 127.0.0.1 only."""
    write_checkpoint(tmp_path, "llama-untied", num_kv_heads=3 if tp == 2 else 6)
    expected = token_ids(LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01))
    addr = f"127.0.0.1:{free_loopback_port()}"
    node1 = subprocess.Popen([sys.executable, "-m", "anycore", "generate", "--prompt", "unused", "--model",
                              str(tmp_path), "--dtype", "float32", "--kv-cache-gb", "0.01",
                              "--tensor-parallel-size", str(tp), "--nnodes", "2", "--node-rank", "1",
                              "--dist-init-addr", addr])
    try:
        llm = LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01, tensor_parallel_size=tp, nnodes=2,
                  node_rank=0, dist_init_addr=addr)
        assert len(llm.engine.parallel.workers) == tp // 2 - 1  # (the other ranks are node 1's)
        assert llm.engine.parallel.group.all_reduce_name() == "gloo"  # (declared nodes: auto is gloo)
        try:
            assert token_ids(llm) == expected
        finally:
            llm.close()
        assert node1.wait(timeout=60) == 0  # rank 0's stop command ends the other node
    finally:
        if node1.poll() is None:
            node1.kill()


@pytest.mark.slow
def test_default_model_tp2_matches_tp1(llm_fp32):
    prompts = ["The capital of France is", "def fibonacci(n):"]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = token_ids(llm_fp32, prompts, params)
    tp2 = LLM(dtype="float32", kv_cache_gb=0.25, tensor_parallel_size=2)
    try:
        # SmolLM2-135M: 9 query heads over 3 KV heads; rank 0 holds 2 KV groups (6 heads)
        assert tp2.engine.kv_pool.k.shape[2] == 2
        assert token_ids(tp2, prompts, params) == expected
    finally:
        tp2.close()
