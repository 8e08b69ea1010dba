"""What every in-process engine of `anycore bench compare` answers, and the shared prompt source.

Each runner loads once and then answers ``decode`` (batch-1 output tok/s over ``n`` tokens after a
16-token prompt), ``prefill`` (tok/s for one ``n``-token prompt) and ``batch`` (aggregate output
tok/s of ``num`` prompts generated together; None where the engine has no batched path).
Prompts are random token ids from a seeded generator shared by every engine, so all engines see
the same token sequences and none gets a prefix-cache hit from an earlier repeat.
"""

from __future__ import annotations

import importlib
import random
from dataclasses import dataclass, field
from typing import Any


class PeerUnavailable(RuntimeError):
    """A peer that cannot run here (package missing, build failed); reported as skipped."""


def require(module: str, hint: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise PeerUnavailable(f"{module} not importable ({e}); {hint}") from None


# Prompt ids are drawn from [1000, 10000): inside every vocabulary the harness meets and clear of
# the low ids, which are special tokens in most of them.
PROMPT_ID_RANGE = (1000, 10000)


def random_prompt(rng: random.Random, n: int) -> list[int]:
    lo, hi = PROMPT_ID_RANGE
    return [rng.randrange(lo, hi) for _ in range(n)]


@dataclass
class Runner:
    name: str
    dtype_class: str  # which peak GEMM its prefill is measured against: fp32 | bf16 | int8
    weight_bytes: int
    info: dict[str, Any] = field(default_factory=dict)

    def decode(self, n: int, rng: random.Random) -> float:
        raise NotImplementedError

    def prefill(self, n: int, rng: random.Random) -> float:
        raise NotImplementedError

    def batch(self, num: int, input_len: int, output_len: int, rng: random.Random) -> float | None:
        return None

    def close(self) -> None:
        pass
