"""Per-decode-step cost of structured output on the default model: batch 1 and 8, with and
without a grammar (a regex that keeps every request decoding), plus the sampler alone.

    python scripts/measure_grammar_overhead.py [--steps 20]

Prints the fastest decode step (ms) of each case, the figure least disturbed by other load on a
shared machine; not a test (CPU timings are noisy)."""

from __future__ import annotations

import argparse
import time

import torch

from anycore import LLM, SamplingParams, StructuredOutput
from anycore.engine.sampler import sample_requests
from anycore.scheduler.request import Request

REGEX = "[a-z ]{400}"  # long enough that no request ends inside the measured steps


def engine_steps(llm: LLM, batch: int, grammar: bool, steps: int) -> float:
    eng = llm.engine
    for i in range(batch):
        so = StructuredOutput("regex", REGEX) if grammar else None
        eng.add_request(eng.tokenizer.encode(f"Write a story number {i}:"),
                        SamplingParams(temperature=0, max_tokens=steps + 8, ignore_eos=True, structured_output=so))
    while any(r.num_output_tokens == 0 for r in eng._requests.values()):
        eng.step()  # prefill
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - t0)
    for rid in eng.request_ids():
        eng.abort(rid)
    return min(times) * 1e3


SCHEMA = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}


def sampler_only(llm: LLM, batch: int, grammar: str | None, reps: int = 200) -> float:
    """The sampler over ``batch`` random logits rows: plain greedy, or greedy with a grammar
    ("regex": REGEX at its start, scattered allowed tokens; "json": SCHEMA inside the string
    value, nearly every token allowed)."""
    from anycore.engine.grammar import GrammarMatcher

    eng = llm.engine
    vocab = eng.model_config.vocab_size
    reqs = []
    for i in range(batch):
        r = Request(f"s{i}", [1, 2], SamplingParams(temperature=0), eng.eos_token_ids)
        if grammar == "regex":
            r.grammar = GrammarMatcher(eng.grammar.compile(StructuredOutput("regex", REGEX)), vocab,
                                       eng.grammar.stop_token_ids)
        elif grammar == "json":
            r.grammar = GrammarMatcher(eng.grammar.compile(StructuredOutput("json_schema", SCHEMA)), vocab,
                                       eng.grammar.stop_token_ids)
            for t in eng.tokenizer.encode('{"story": "Once upon', add_special_tokens=False):
                assert r.grammar.accept(t)
        reqs.append(r)
    logits = torch.randn(batch, vocab)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        sample_requests(logits, reqs)
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    # decode_burst=1: a plain greedy request alone would otherwise take the multi-step native
    # decode, which a grammar request never takes; this compares one step with one step
    llm = LLM(dtype="float32", kv_cache_gb=0.25, decode_burst=1)
    engine_steps(llm, 1, True, 3)  # warm up (xgrammar import, kernels)
    for batch in (1, 8):
        plain = engine_steps(llm, batch, False, args.steps)
        guided = engine_steps(llm, batch, True, args.steps)
        s_plain, s_regex, s_json = (sampler_only(llm, batch, g) for g in (None, "regex", "json"))
        print(f"batch {batch}: decode step {plain:.2f} ms plain, {guided:.2f} ms with a grammar "
              f"({guided - plain:+.2f} ms); sampler alone {s_plain:.3f} ms plain, {s_regex:.3f} ms regex, "
              f"{s_json:.3f} ms inside a JSON string")


if __name__ == "__main__":
    main()
