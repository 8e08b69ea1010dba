"""Logprobs through the official `openai` client: /v1/completions echo (with and without logprobs,
max_tokens=0, streamed, several prompts, n > 1), vLLM's prompt_logprobs on both endpoints
(equal to the offline engine's), the top_logprobs=0 / logprobs=0 shapes,
stream_options.continuous_usage_stats and /tokenize's token_strs."""

from __future__ import annotations

import httpx
import pytest

from anycore import SamplingParams

pytestmark = pytest.mark.slow

MODEL = "smollm2"
PROMPT = "The three primary colors are red, blue and"
TOL = 1e-4


@pytest.fixture(scope="module")
def prompt_ids(server):
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": PROMPT}, headers=server.headers, timeout=60)
    return r.json()["tokens"]


@pytest.fixture(scope="module")
def offline(llm_fp32, prompt_ids):
    """The offline engine's prompt logprobs (top 3) for PROMPT."""
    return llm_fp32.generate([prompt_ids], SamplingParams(max_tokens=0, prompt_logprobs=3))[0].prompt_logprobs


def test_echo_without_logprobs_prepends_the_prompt(client):
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
    echo = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True)
    assert echo.choices[0].text == PROMPT + plain.choices[0].text and echo.choices[0].logprobs is None
    assert echo.usage.prompt_tokens == plain.usage.prompt_tokens


def test_echo_logprobs_cover_prompt_then_output(client, prompt_ids, offline, server):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=2,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    n = len(prompt_ids)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n + 3
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for i in range(1, n):
        assert abs(lp.token_logprobs[i] - offline[i].logprob) < TOL
        assert len(lp.top_logprobs[i]) in (2, 3)  # the top 2, plus the prompt token when it is not among them
        assert lp.tokens[i] in lp.top_logprobs[i]
    detok = [httpx.post(f"{server.url}/detokenize", json={"tokens": [t]}, headers=server.headers).json()["prompt"]
             for t in prompt_ids[:3]]
    assert lp.tokens[:3] == detok
    assert lp.text_offset[:3] == [0, len(detok[0]), len(detok[0]) + len(detok[1])]
    # the generated part equals a request without echo
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=2,
                                      extra_body={"ignore_eos": True}).choices[0]
    assert lp.tokens[n:] == plain.logprobs.tokens
    assert all(abs(a - b) < TOL for a, b in zip(lp.token_logprobs[n:], plain.logprobs.token_logprobs))
    assert r.choices[0].text == PROMPT + plain.text


def test_max_tokens_zero_with_echo_scores_the_prompt(client, prompt_ids, offline):
    r = client.completions.create(model=MODEL, prompt=[PROMPT, "Hello there"], max_tokens=0, echo=True, logprobs=0,
                                  n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == [PROMPT, PROMPT, "Hello there", "Hello there"]
    assert {c.finish_reason for c in r.choices} == {"length"} and r.usage.completion_tokens == 0
    lp = r.choices[1].logprobs
    assert len(lp.tokens) == len(prompt_ids)
    got = lp.token_logprobs[1:]
    assert all(abs(g - w.logprob) < TOL for g, w in zip(got, offline[1:]))
    # logprobs=0: each position's dict is just the token itself (OpenAI's "always the sampled token")
    assert all(list(t) == [tok] for t, tok in zip(lp.top_logprobs[1:], lp.tokens[1:]))


def test_max_tokens_zero_needs_echo(server):
    r = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 0},
                   headers=server.headers, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_streamed_echo_first_chunk_carries_the_prompt(client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True, logprobs=1,
                                     extra_body={"ignore_eos": True}).choices[0]
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True,
                                            logprobs=1, stream=True, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].text.startswith(PROMPT)
    assert "".join(c.choices[0].text for c in chunks) == full.text
    tokens = [t for c in chunks for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in chunks for o in c.choices[0].logprobs.text_offset]
    assert tokens == full.logprobs.tokens and offsets == full.logprobs.text_offset
    # streamed max_tokens=0: one chunk with the prompt and the finish reason
    zero = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, stream=True))
    assert [c.choices[0].text for c in zero] == [PROMPT] and zero[0].choices[0].finish_reason == "length"


def test_vllm_prompt_logprobs_on_completions_and_chat(client, prompt_ids, offline):
    r = client.completions.create(model=MODEL, prompt=prompt_ids, max_tokens=1, temperature=0,
                                  extra_body={"prompt_logprobs": 2})
    plps = r.choices[0].model_extra["prompt_logprobs"]
    assert len(plps) == len(prompt_ids) and plps[0] is None
    for i in range(1, len(prompt_ids)):
        entry, want = plps[i], offline[i]
        mine = entry[str(prompt_ids[i])]
        assert abs(mine["logprob"] - want.logprob) < TOL and mine["rank"] == want.rank
        assert mine["decoded_token"]
        assert next(iter(entry)) == str(prompt_ids[i])  # the prompt token first, then the top 2
        assert set(entry) == {str(prompt_ids[i])} | {str(t) for t, _ in want.top[:2]}
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1,
                                          temperature=0, extra_body={"prompt_logprobs": 0})
    cp = chat.model_extra["prompt_logprobs"]
    assert cp[0] is None and all(len(e) == 1 for e in cp[1:]) and len(cp) == chat.usage.prompt_tokens


def test_prompt_logprobs_are_refused_when_streaming(server):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1, "stream": True, "prompt_logprobs": 1}
    r = httpx.post(f"{server.url}/v1/completions", json=body, headers=server.headers, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"


def test_prompt_logprobs_ignore_the_prefix_cache(client, prompt_ids):
    """The same prompt again is a cache hit for a plain request but not for prompt logprobs,
    and the values do not change."""
    first = client.completions.create(model=MODEL, prompt=prompt_ids, max_tokens=0, echo=True, logprobs=0)
    again = client.completions.create(model=MODEL, prompt=prompt_ids, max_tokens=0, echo=True, logprobs=0)
    plain = client.completions.create(model=MODEL, prompt=prompt_ids, max_tokens=1, temperature=0)
    assert plain.usage.prompt_tokens_details.cached_tokens > 0
    assert again.usage.prompt_tokens_details.cached_tokens == 0
    a, b = first.choices[0].logprobs.token_logprobs, again.choices[0].logprobs.token_logprobs
    assert a[0] is None and b[0] is None and all(abs(x - y) < TOL for x, y in zip(a[1:], b[1:]))


def test_top_logprobs_zero_shapes(client):
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                          temperature=0, logprobs=True, top_logprobs=0)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(e.top_logprobs == [] and e.logprob <= 0 and e.bytes == list(e.token.encode()) for e in content)
    comp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=0,
                                     extra_body={"ignore_eos": True}).choices[0]
    lp = comp.logprobs
    assert len(lp.token_logprobs) == 3 and all(v <= 0 for v in lp.token_logprobs)
    assert [list(t) for t in lp.top_logprobs] == [[t] for t in lp.tokens]
    assert [t[tok] for t, tok in zip(lp.top_logprobs, lp.tokens)] == lp.token_logprobs


def test_continuous_usage_stats_count_up(client):
    opts = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, stream=True,
                                            stream_options=opts, extra_body={"ignore_eos": True}))
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counts == sorted(counts) and counts[0] >= 1 and counts[-1] == 5 and len(set(counts)) >= 3
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert {c.usage.prompt_tokens for c in chunks} == {chunks[-1].usage.prompt_tokens}
    assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens for c in chunks)

    chat = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count to 9"}],
                                               max_tokens=5, temperature=0, stream=True, stream_options=opts,
                                               extra_body={"ignore_eos": True}))
    counts = [c.usage.completion_tokens for c in chat]
    assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 5


def test_continuous_usage_stats_need_include_usage(server):
    body = {"model": MODEL, "prompt": PROMPT, "stream": True, "stream_options": {"continuous_usage_stats": True}}
    r = httpx.post(f"{server.url}/v1/completions", json=body, headers=server.headers, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options.continuous_usage_stats"


def test_tokenize_token_strs(server, tokenizer):
    h = server.headers
    plain = httpx.post(f"{server.url}/tokenize", json={"prompt": "hello world"}, headers=h).json()
    assert "token_strs" not in plain
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": "hello world", "return_token_strs": True}, headers=h).json()
    assert r["tokens"] == plain["tokens"] and len(r["token_strs"]) == r["count"]
    assert r["token_strs"][-1] == "Ġworld"  # the vocabulary's spelling (byte-level BPE), as vLLM answers
    assert "".join(r["token_strs"]).replace("Ġ", " ") == tokenizer.decode(r["tokens"])
