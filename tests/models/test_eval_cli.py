"""`anycore eval perplexity|agreement` on the default model, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from anycore.cli import main
from anycore.eval_perplexity import LlamaCppScorer, perplexity, tokenize_file

PROSE = Path(__file__).resolve().parents[1] / "data" / "prose.txt"  # shipped: tests/data/SOURCE.md


@pytest.mark.slow
def test_agreement_cli_reports_both_figures(tmp_path, capsys):
    out = tmp_path / "agreement.json"
    assert main(["eval", "agreement", "--dtype", "float32", "--quantization", "w8a8_int8", "--tokens", "4",
                 "--kv-cache-gb", "0.1", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["prompts"] == 16 and r["max_tokens"] == 4 and r["quantization"] == "w8a8_int8"
    assert len(r["first_divergence"]) == 16 and all(0 <= f <= 4 for f in r["first_divergence"])
    assert 0.5 < r["teacher_forced"] <= 1.0
    assert "teacher-forced" in capsys.readouterr().out


def test_agreement_cli_refuses_a_candidate_equal_to_its_reference(capsys):
    assert main(["eval", "agreement", "--dtype", "float32"]) == 2
    assert "differs from its reference" in capsys.readouterr().err
    assert main(["eval", "agreement", "--quantization", "none"]) == 2  # bf16 dense vs itself


@pytest.mark.slow
def test_next_token_logprobs_agree_with_score(llm_fp32):
    ids = [1, 504, 3458, 282, 4, 9, 42, 1000]
    full = llm_fp32.engine.next_token_logprobs(ids)
    assert full.shape == (len(ids), llm_fp32.engine.model_config.vocab_size)
    gathered = full[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    torch.testing.assert_close(gathered, llm_fp32.engine.score(ids))
    # a sum of 49,152 fp32 probabilities: 1 to its rounding (1.6e-5 off seen on an AVX2-only Zen 3)
    torch.testing.assert_close(full.exp().sum(-1), torch.ones(len(ids)), rtol=0, atol=1e-4)


@pytest.mark.slow
def test_llama_cpp_scores_the_same_windows(default_model_path, llm_fp32):
    """llama.cpp reading the same GGUF scores anycore's token ids about as anycore's fp32 does
    (it multiplies with 8-bit activations on Q4_1 weights, so not bit for bit)."""
    pytest.importorskip("llama_cpp")
    ids = tokenize_file(llm_fp32.engine, str(PROSE), 512)
    ours = perplexity(llm_fp32.engine, ids, ctx=256)
    scorer = LlamaCppScorer(str(default_model_path), ctx=256, threads=2)
    theirs = perplexity(scorer, ids, ctx=256)
    assert theirs.tokens_scored == ours.tokens_scored == 256
    assert abs(theirs.perplexity / ours.perplexity - 1) < 0.03, (ours, theirs)
    assert scorer.tokenize("Hello world") == llm_fp32.engine.tokenizer.encode("Hello world")
