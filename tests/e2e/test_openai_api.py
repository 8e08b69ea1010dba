"""OpenAI semantics through the official `openai` client: chat/completions, streaming, n, stop,
logprobs, seeds, usage; plus the native /generate, /tokenize, /detokenize routes."""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.slow

MODEL = "smollm2"  # --served-model-name in conftest.py

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a fruit."}]
PROMPT = "The three primary colors are"


def test_health_went_from_503_to_200_and_models_listed(server, client):
    assert 503 in server.health_statuses and server.health_statuses[-1] == 200
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_stream_matches_non_stream(client):
    full = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=0)
    choice = full.choices[0]
    assert full.object == "chat.completion" and full.id.startswith("chatcmpl-") and full.model == MODEL
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    u = full.usage
    assert u.completion_tokens <= 6 and u.total_tokens == u.prompt_tokens + u.completion_tokens

    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [choice.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == u.completion_tokens
    assert chunks[-1].usage.prompt_tokens == u.prompt_tokens
    assert len({c.id for c in chunks}) == 1


def test_completion_stream_usage_and_prompt_count(server, client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert full.object == "text_completion" and full.choices[0].finish_reason == "length"
    n_prompt = httpx.post(f"{server.url}/tokenize", json={"prompt": PROMPT}, headers=server.headers).json()["count"]
    assert full.usage.prompt_tokens == n_prompt and full.usage.completion_tokens == 5

    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage.completion_tokens == 5 and chunks[-1].usage.prompt_tokens == n_prompt


def test_n2_and_seed_reproducibility(client):
    def sample(seed):
        r = client.completions.create(model=MODEL, prompt="My favourite animal is", max_tokens=5, n=2,
                                      temperature=1.0, seed=seed)
        assert sorted(c.index for c in r.choices) == [0, 1]
        assert 2 <= r.usage.completion_tokens <= 10
        return [c.text for c in sorted(r.choices, key=lambda c: c.index)]

    a, b = sample(1234), sample(1234)
    assert a == b


def test_stop_string_truncates(client):
    base = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    words = base.split()
    assert len(words) >= 2, base
    stop = words[1]
    cut = base[: base.index(stop)]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stop=[stop, "zzzq"])
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"


def test_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert len(t.top_logprobs) == 2 and t.logprob <= 0.0
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4  # greedy picks the best
    assert "".join(t.token for t in content) == r.choices[0].message.content

    c = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=2,
                                  extra_body={"ignore_eos": True})
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert all(len(top) <= 2 for top in lp.top_logprobs) and lp.text_offset[0] == 0


def test_batched_prompts_and_token_ids(client):
    for prompt in ([[504, 3458, 314], [19556, 28]], ["Hello", "Goodbye"]):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0, n=2)
        assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
        assert r.choices[0].text == r.choices[1].text  # greedy: both samples of a prompt agree


def test_native_generate_tokenize_detokenize(server):
    h = server.headers
    tok = httpx.post(f"{server.url}/tokenize", json={"prompt": "hello world", "add_special_tokens": False},
                     headers=h).json()
    assert tok["count"] == len(tok["tokens"]) > 0 and tok["max_model_len"] > 0
    assert httpx.post(f"{server.url}/detokenize", json={"tokens": tok["tokens"]}, headers=h).json()["prompt"] == \
        "hello world"
    chat_tok = httpx.post(f"{server.url}/tokenize", json={"messages": CHAT}, headers=h).json()
    assert chat_tok["count"] > tok["count"]

    g = httpx.post(f"{server.url}/generate", headers=h, timeout=120,
                   json={"text": PROMPT, "sampling_params": {"max_new_tokens": 3, "temperature": 0,
                                                             "ignore_eos": True}}).json()
    assert len(g["output_ids"]) == 3 and g["meta_info"]["finish_reason"] == "length"
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": PROMPT}, headers=h).json()["tokens"]
    events = []
    with httpx.stream("POST", f"{server.url}/generate", headers=h, timeout=120,
                      json={"input_ids": ids, "stream": True,
                            "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}}) as s:
        for line in s.iter_lines():
            if line.startswith("data:"):
                events.append(line[5:].strip())
    assert events[-1] == "[DONE]"
    streamed = [json.loads(e) for e in events[:-1]]
    assert [t for e in streamed for t in e["output_ids"]] == g["output_ids"]
    assert "".join(e["text"] for e in streamed) == g["text"] and streamed[-1]["finished"]


def test_platform_bookkeeping_fields_are_accepted_and_change_nothing(client):
    plain = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=0)
    tagged = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=6, temperature=0, user="u1", metadata={"k": "v"}, store=False,
        service_tier="auto", modalities=["text"], extra_body={"prompt_cache_key": "c", "safety_identifier": "s"})
    assert tagged.choices[0].message.content == plain.choices[0].message.content
