"""Speculative decoding on the default model (bf16, as served):

1. ``cost``: one engine step's time, plain decode vs a verify step of 1 + k tokens per request,
   at batch sizes 1..16 (every draft rejected: the price of verification alone). Where the
   ratio climbs well above 1 verification stops being free: ``--speculative-max-batch``.
2. ``speedup``: batch-1 decode speed with n-gram drafts vs without, on an input-grounded task
   (repeat / edit a given text from tests/data/prose.txt) and on open chat; the same process,
   runs interleaved, medians; acceptance length from Engine.stats().

    python scripts/measure_speculative.py [cost|speedup|both] [--reps 3] [--tokens 96]

Not a test: CPU timings on a shared machine are noisy; the load average is printed with them."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from anycore import LLM, SamplingParams
from anycore.scheduler.request import Request
from anycore.spec.policy import SpecState, SpeculativeConfig, Speculator

PROSE = (Path(__file__).resolve().parents[1] / "tests" / "data" / "prose.txt").read_text()


class AlwaysDraft(Speculator):
    """Proposes k copies of the last token for every request (mostly rejected)."""

    def propose(self, req: Request, limit: int, batch_size: int) -> list[int]:
        req.spec_state = req.spec_state or SpecState()
        return [req.all_token_ids[-1]] * min(self.config.num_tokens, limit)


def step_ms(llm: LLM, batch: int, speculator: Speculator | None, steps: int) -> float:
    eng = llm.engine
    eng.scheduler.speculator = None
    for i in range(batch):
        eng.add_request(eng.tokenizer.encode(f"Write a story number {i}:"),
                        SamplingParams(temperature=0, max_tokens=10 * steps + 8, ignore_eos=True))
    while any(r.num_output_tokens == 0 for r in eng._requests.values()):
        eng.step()  # prefill
    eng.scheduler.speculator = speculator
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - t0)
    for rid in eng.request_ids():
        eng.abort(rid)
    eng.scheduler.speculator = None
    return min(times) * 1e3


def cost(llm: LLM, k: int, steps: int) -> None:
    print(f"step time (fastest of {steps}), plain decode vs verify of 1+{k} tokens per request:")
    print(" batch  plain_ms  verify_ms  ratio")
    for batch in (1, 2, 4, 8, 16):
        plain = step_ms(llm, batch, None, steps)
        verify = step_ms(llm, batch, AlwaysDraft(SpeculativeConfig(num_tokens=k)), steps)
        print(f"{batch:6d}  {plain:8.2f}  {verify:9.2f}  {verify / plain:5.2f}")


def prompts(llm: LLM) -> dict[str, list[int]]:
    text = PROSE[:900]
    tasks = {
        "repeat": f"Repeat the following text exactly, word for word:\n\n{text}",
        "edit": f"Rewrite the following text, replacing every 'the' with 'THE' and changing nothing else:\n\n{text}",
        "chat": "Tell me about the history of the bicycle and why it became popular.",
    }
    tok = llm.engine.tokenizer
    return {name: tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True)
            for name, c in tasks.items()}


def speedup(llm: LLM, reps: int, tokens: int, k: int, draft_layers: int | None) -> None:
    eng = llm.engine
    spec = Speculator(SpeculativeConfig(num_tokens=k))
    if draft_layers:  # a self-draft: the target's first layers and its head
        from anycore.spec.draft_model import DraftModelSpeculator, load_draft_model

        model = load_draft_model(None, eng.model_config, eng.ops, eng.dtype, eng.max_model_len, None, draft_layers)
        spec = DraftModelSpeculator(SpeculativeConfig("draft", num_tokens=k, draft_layers=draft_layers), model,
                                    eng.ops, eng.kv.num_slots, eng.dtype)
        print(f"drafts: the target's first {draft_layers} of {eng.model_config.num_layers} layers")
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    print(f"batch-1 greedy decode, {tokens} tokens, k={k}, {reps} interleaved runs each, medians:")
    print(" task    plain_tok/s  spec_tok/s  speedup  accept_len  same_tokens")
    for name, ids in prompts(llm).items():
        rates: dict[str, list[float]] = {"plain": [], "spec": []}
        outputs = {}
        accept = []
        for _ in range(reps):
            for mode in ("plain", "spec"):
                eng.scheduler.speculator = spec if mode == "spec" else None
                eng.add_request(ids, params)
                while not eng._requests or all(r.num_output_tokens == 0 for r in eng._requests.values()):
                    eng.step()  # prefill (and the first token): not timed
                before = spec.totals.num_verify_steps, spec.totals.num_accepted_tokens
                n0 = next(iter(eng._requests.values())).num_output_tokens
                t0 = time.perf_counter()
                result = None
                got: list[int] = []
                while eng.has_unfinished():
                    for o in eng.step():
                        got += o.new_token_ids
                        if o.finished:
                            result = o
                elapsed = time.perf_counter() - t0
                rates[mode].append((result.num_output_tokens - n0) / elapsed)
                outputs[mode] = got
                if mode == "spec":
                    steps = spec.totals.num_verify_steps - before[0]
                    acc = spec.totals.num_accepted_tokens - before[1]
                    accept.append(1 + acc / steps if steps else 0.0)
        eng.scheduler.speculator = None
        p, s = statistics.median(rates["plain"]), statistics.median(rates["spec"])
        same = outputs["plain"] == outputs["spec"]
        print(f" {name:7s} {p:11.1f}  {s:10.1f}  {s / p:7.2f}  {statistics.median(accept):10.2f}  {same}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="?", default="both", choices=["cost", "speedup", "both"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--draft-layers", type=int, default=None, help="draft with a self-draft of N layers, not n-grams")
    args = ap.parse_args()
    llm = LLM(kv_cache_gb=0.25, speculative_algorithm="ngram")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    if args.what in ("cost", "both"):
        cost(llm, args.k, args.steps)
    if args.what in ("speedup", "both"):
        speedup(llm, args.reps, args.tokens, args.k, args.draft_layers)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
