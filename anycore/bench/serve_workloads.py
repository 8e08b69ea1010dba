"""Serving workloads for `anycore bench compare`, driven through ``anycore.bench.serving``.

- ``load_level``: streaming /v1/completions at a fixed concurrency (random token-id prompts,
  ignore_eos), giving output tok/s, TTFT and ITL medians.
- ``shared_prefix``: the TTFT of one cold ~1000-token prompt, then of 16 requests sharing one
  ~1000-token prefix with different short suffixes at concurrency 4 (a prefix cache shows here).
  One request with that prefix runs alone first (``prime_ttft_s``), so the c=4 requests all
  find the prefix already computed, as the metric means (without it the first wave of 4 paid
  the prefix and took 4 of the 16 places in the median). Each TTFT is measured from the send.
Every repeat uses a different seed, so no prompt is a cache hit of an earlier repeat.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
from typing import Any

from anycore.bench import serving


def serving_args(base_url: str, concurrency: int, num_prompts: int, input_len: int, output_len: int,
                 seed: int) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    serving.add_serving_args(p)
    args = p.parse_args([])
    args.base_url, args.concurrency, args.num_prompts = base_url, concurrency, num_prompts
    args.input_len, args.output_len, args.seed, args.ignore_eos = input_len, output_len, seed, True
    return args


def load_level(base_url: str, concurrency: int, num_prompts: int, input_len: int, output_len: int,
               seed: int) -> dict[str, Any]:
    s = asyncio.run(serving.benchmark(serving_args(base_url, concurrency, num_prompts, input_len, output_len, seed)))
    if not s["completed"] or s["failed"]:
        raise RuntimeError(f"{s['failed']} of {s['num_prompts']} requests failed: {s['errors']}")
    return s


async def _shared_prefix(base_url: str, seed: int, prefix_len: int, suffix_len: int, num: int, concurrency: int,
                         max_tokens: int) -> dict[str, Any]:
    import httpx

    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(1000, 10000) for _ in range(n)]

    async with httpx.AsyncClient(timeout=600) as client:
        model = (await client.get(f"{base_url}/v1/models")).json()["data"][0]["id"]
        url = f"{base_url}/v1/completions"

        def body(prompt: list[int]) -> dict[str, Any]:
            return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                    "ignore_eos": True}

        async def one(prompt: list[int]) -> float:
            r = await serving.stream_completion(client, url, body(prompt), 600)
            if not r.ok:
                raise RuntimeError(f"request failed: {r.error}")
            return r.ttft

        cold = await one(ids(prefix_len + suffix_len))
        prefix = ids(prefix_len)
        prime = await one(prefix + ids(suffix_len))  # computes (and caches) the shared prefix
        prompts = [prefix + ids(suffix_len) for _ in range(num)]
        sem = asyncio.Semaphore(concurrency)

        async def limited(p: list[int]) -> float:
            async with sem:
                return await one(p)

        shared = await asyncio.gather(*(limited(p) for p in prompts))
        alone = await one(prefix + ids(suffix_len))  # one more, alone, once the prefix is surely cached
    return {"cold_ttft_s": cold, "prime_ttft_s": prime, "shared_ttft_s": list(shared), "shared_ttft_p50_s": statistics.median(shared),
            "shared_first_wave_ttft_s": statistics.fmean(shared[:concurrency]), "alone_ttft_s": alone}


def shared_prefix(base_url: str, seed: int, prefix_len: int = 992, suffix_len: int = 20, num: int = 16,
                  concurrency: int = 4, max_tokens: int = 8) -> dict[str, Any]:
    return asyncio.run(_shared_prefix(base_url, seed, prefix_len, suffix_len, num, concurrency, max_tokens))
