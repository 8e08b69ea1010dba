"""anycore's engine in-process for `anycore bench compare`: the same measurement functions as
`anycore bench latency | throughput`, fed the prompts every engine of the run shares."""

from __future__ import annotations

import random
from dataclasses import replace

from anycore.bench.offline import PromptSource, measure_decode, measure_prefill, measure_throughput
from anycore.bench.peers.base import Runner, random_prompt
from anycore.config import EngineConfig


def shared_prompts(rng: random.Random) -> PromptSource:
    """The ids ``random_prompt`` draws for the peers, in the same order, from the same ``rng``."""
    return lambda n: random_prompt(rng, n)


class AnycoreRunner(Runner):
    def __init__(self, name: str, config: EngineConfig) -> None:
        from anycore.engine.engine import Engine

        # prefill of the default 512-token prompt in one step, as llama.cpp's n_batch 512 does
        # (offline: an unset decode_burst is the offline API's, EngineConfig.for_offline)
        self.engine = Engine(replace(config.for_offline(), max_num_batched_tokens=max(config.max_num_batched_tokens, 512)))
        dtype_class = "int8" if self.engine.quantization else ("bf16" if config.dtype == "bfloat16" else "fp32")
        super().__init__(name, dtype_class, self.engine.weight_bytes,
                         {"kernels": dict(self.engine.ops.choices), "quantization": self.engine.quantization})
        self.decode(8, random.Random(-1))  # warm-up

    def decode(self, n: int, rng: random.Random) -> float:
        return measure_decode(self.engine, n, shared_prompts(rng))

    def prefill(self, n: int, rng: random.Random) -> float:
        return measure_prefill(self.engine, n, shared_prompts(rng))

    def batch(self, num: int, input_len: int, output_len: int, rng: random.Random) -> float | None:
        return measure_throughput(self.engine, num, input_len, output_len, shared_prompts(rng))["output_tok_s"]
