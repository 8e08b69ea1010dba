"""lm-evaluation-harness against the live server, on two tiny tasks shipped in tests/data/lm_eval:

- ``local-completions`` on a multiple-choice task: lm-eval's loglikelihood path (token-id
  prompts, echo, logprobs=1, max_tokens=1). Every loglikelihood it got, its greedy flags and its
  accuracy must equal what the offline engine's prompt logprobs give for the same token ids.
- ``local-chat-completions`` on a generation task (generate_until): each answer must equal the
  offline engine's greedy chat answer to the same message.

lm-eval runs in a subprocess (tests/e2e/lm_eval_driver.py) with the Hugging Face libraries
offline and their caches in a temporary folder: data come from the repository's JSONL files,
the tokenizer from the default model's local tokenizer folder, nothing from the network.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from anycore import SamplingParams

pytestmark = pytest.mark.slow
pytest.importorskip("lm_eval")

REPO = Path(__file__).parents[2]
TASKS = REPO / "tests" / "data" / "lm_eval"
DRIVER = Path(__file__).with_name("lm_eval_driver.py")
MC_DOCS = sum(1 for _ in (TASKS / "anycore_mc.jsonl").open())
GEN_DOCS = sum(1 for _ in (TASKS / "anycore_gen.jsonl").open())


def run_lm_eval(server, tmp_path: Path, model: str, model_args: dict[str, object], task: str, chat: bool = False):
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path / "datasets"),
           "OPENAI_API_KEY": server.api_key, "TOKENIZERS_PARALLELISM": "false"}
    out = tmp_path / f"{task}.json"
    args = ",".join(f"{k}={v}" for k, v in {"model": server.model, "num_concurrent": 1, "max_retries": 1,
                                             **model_args}.items())
    cmd = [sys.executable, str(DRIVER), model, args, task, str(TASKS), str(out)] + (["--chat"] if chat else [])
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split of a (context, continuation) pair into token ids: trailing spaces of the
    context move to the continuation; the whole is encoded and the context's tokens cut off."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation, context = context[-n_spaces:] + continuation, context[:-n_spaces]
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    ctx = tokenizer.encode(context, add_special_tokens=False)
    return ctx, whole[len(ctx):]


def test_multiple_choice_loglikelihoods_match_the_offline_engine(server, llm_fp32, tokenizer, tmp_path):
    tokenizer_dir = tmp_path / "tokenizer"  # the default model's tokenizer files, for lm-eval's own tokenizing
    tokenizer.save_pretrained(tokenizer_dir)
    result = run_lm_eval(server, tmp_path, "local-completions", {
        "base_url": f"{server.url}/v1/completions", "tokenizer_backend": "huggingface",
        "tokenizer": tokenizer_dir, "tokenized_requests": True, "batch_size": 6}, "anycore_mc")
    samples = result["samples"]
    assert len(samples) == MC_DOCS and result["results"]["sample_len"] == MC_DOCS

    pairs = [encode_pair(tokenizer, ctx, cont) for s in samples for ctx, cont in s["arguments"]]
    outs = llm_fp32.generate([c + k for c, k in pairs], SamplingParams(max_tokens=0, prompt_logprobs=0))
    want = []
    for (ctx, cont), o in zip(pairs, outs):
        lps = o.prompt_logprobs[len(ctx):]
        assert len(lps) == len(cont) >= 1
        want.append((sum(lp.logprob for lp in lps), all(lp.rank == 1 for lp in lps)))

    got = [tuple(r[0]) for s in samples for r in s["resps"]]
    assert len(got) == len(want)
    for (g_ll, g_greedy), (w_ll, w_greedy) in zip(got, want):
        assert abs(g_ll - w_ll) < 1e-3 and g_greedy == w_greedy
    # accuracy: the choice with the highest loglikelihood is the answer
    correct, i = 0, 0
    for s in samples:
        lls = [w[0] for w in want[i : i + len(s["arguments"])]]
        i += len(s["arguments"])
        correct += max(range(len(lls)), key=lls.__getitem__) == int(s["target"])
    assert result["results"]["acc,none"] == pytest.approx(correct / MC_DOCS)
    assert correct > MC_DOCS // 2  # (a sanity check on the task: most answers are easy)


def test_chat_generation_matches_the_offline_engine(server, llm_fp32, tmp_path):
    result = run_lm_eval(server, tmp_path, "local-chat-completions", {
        "base_url": f"{server.url}/v1/chat/completions", "tokenizer_backend": None}, "anycore_gen", chat=True)
    samples = result["samples"]
    assert len(samples) == GEN_DOCS
    for s in samples:
        prompt = s["arguments"][0][0]  # (lm-eval's JsonChatStr, a named tuple: a list in JSON)
        messages = json.loads(prompt[0] if isinstance(prompt, list) else prompt)
        offline = llm_fp32.chat(messages, SamplingParams(temperature=0, max_tokens=8, stop=["\n"]))[0].text
        assert s["resps"][0][0] == offline and offline
    assert 0.0 <= result["results"]["exact_match,none"] <= 1.0
