"""`anycore eval agreement`: how closely greedy decoding of one model follows another's.

Meant for a quantized model against its float reference: both decode the same prompts
greedily for a fixed number of tokens (EOS ignored, so every prompt yields the same count).
Two figures:

- free-running: how far each candidate continuation runs before its first token that differs
  from the reference's. Once two greedy runs diverge, what follows is conditioned on different
  text, so later positions are not compared. On a small model this is harsh: one near-tie
  (two tokens with almost equal logits) ends a whole continuation.
- teacher-forced: the candidate reads the reference's continuation and, at every position,
  we check whether its own greedy choice is the reference's next token. Every position counts
  once, whatever happened before it. The reference scored the same way against its own
  decode gives the floor set by arithmetic alone (prefill and decode round differently).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from anycore.llm import LLM
from anycore.sampling_params import SamplingParams

# A fixed, varied prompt set (instructions, facts, reasoning, code, prose, lists); shipped
# with anycore so figures are comparable between runs and machines.
DEFAULT_PROMPTS: tuple[str, ...] = (
    "Explain in a few sentences why the sky is blue.",
    "Write a short poem about a lighthouse in winter.",
    "What is the capital of Australia, and why was it chosen?",
    "Give three tips for writing clear emails at work.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Summarize the water cycle for a ten-year-old.",
    "A train leaves at 9:40 and the journey takes 2 hours 35 minutes. When does it arrive?",
    "List five common houseplants that are easy to care for.",
    "What is the difference between a virus and a bacterium?",
    "Describe the taste of a fresh lemon to someone who has never had one.",
    "How do I reverse a list in JavaScript?",
    "Tell me a short story about a robot who learns to paint.",
    "What are the main causes of inflation?",
    "Translate 'good morning, how are you?' into Spanish and French.",
    "Why do cats purr?",
    "Explain what a database index is and when to use one.",
)


@dataclass
class AgreementResult:
    prompts: int
    max_tokens: int
    position_agreement: float  # generated positions before the first divergence / all positions
    identical: float  # fraction of prompts whose whole continuation matches
    first_divergence: list[int]  # per prompt: index of the first differing token (max_tokens if none)
    teacher_forced: float | None = None  # candidate's greedy choice == reference's next token, all positions
    reference_teacher_forced: float | None = None  # the same for the reference itself (the numeric floor)


def first_divergence(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def agreement(reference: list[list[int]], candidate: list[list[int]], max_tokens: int) -> AgreementResult:
    """Agreement of equally long greedy continuations (one list of token ids per prompt)."""
    if len(reference) != len(candidate) or not reference:
        raise ValueError("reference and candidate need the same, non-zero number of continuations")
    if any(len(r) != max_tokens or len(c) != max_tokens for r, c in zip(reference, candidate)):
        raise ValueError(f"every continuation must have exactly {max_tokens} tokens")
    firsts = [first_divergence(r, c) for r, c in zip(reference, candidate)]
    return AgreementResult(
        prompts=len(firsts),
        max_tokens=max_tokens,
        position_agreement=sum(firsts) / (len(firsts) * max_tokens),
        identical=sum(f == max_tokens for f in firsts) / len(firsts),
        first_divergence=firsts,
    )


def encode_prompts(llm: LLM, prompts: tuple[str, ...] | list[str], chat: bool) -> list[list[int]]:
    """Token ids of each prompt, wrapped in the model's chat template when ``chat``."""
    if chat:
        return [llm.apply_chat_template([{"role": "user", "content": p}]) for p in prompts]
    return [llm.tokenizer.encode(p) for p in prompts]


def greedy_continuations(llm: LLM, prompt_ids: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompt_ids, params)]


def teacher_forced_agreement(llm: LLM, prompt_ids: list[list[int]], continuations: list[list[int]]) -> float:
    """Fraction of continuation positions where ``llm``'s greedy choice, given the prompt and
    the continuation so far, is the continuation's next token."""
    hits = total = 0
    for prompt, cont in zip(prompt_ids, continuations):
        logprobs = llm.engine.next_token_logprobs(prompt + cont[:-1])
        predicted = logprobs[len(prompt) - 1 :].argmax(dim=-1)
        hits += int((predicted == torch.tensor(cont)).sum())
        total += len(cont)
    return hits / total


def greedy_agreement(reference: LLM, candidate: LLM, prompts: tuple[str, ...] | list[str] = DEFAULT_PROMPTS,
                     max_tokens: int = 64, chat: bool = True) -> AgreementResult:
    """Greedy agreement of ``candidate`` with ``reference`` (same tokenizer) on ``prompts``."""
    return agreement_on_ids(reference, candidate, encode_prompts(reference, prompts, chat), max_tokens)


def agreement_on_ids(reference: LLM, candidate: LLM, ids: list[list[int]], max_tokens: int) -> AgreementResult:
    """Both figures for prompts given as token ids."""
    ref = greedy_continuations(reference, ids, max_tokens)
    result = agreement(ref, greedy_continuations(candidate, ids, max_tokens), max_tokens)
    result.teacher_forced = teacher_forced_agreement(candidate, ids, ref)
    result.reference_teacher_forced = teacher_forced_agreement(reference, ids, ref)
    return result
