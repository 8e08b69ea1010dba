"""Structured output and logit_bias through the live server, with the official openai client:
OpenAI's response_format, vLLM's guided_* extras, SGLang's /generate fields, and the 400s."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

pytest.importorskip("xgrammar")

from tests.e2e.conftest import MODEL  # noqa: E402

ASK = [{"role": "user", "content": "Describe a cat as JSON."}]
CAT = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                        "legs": {"type": "integer", "minimum": 0, "maximum": 8},
                                        "indoor": {"type": "boolean"}},
       "required": ["name", "legs", "indoor"], "additionalProperties": False}


def check_cat(text: str) -> None:
    obj = json.loads(text)
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(obj, CAT)


def test_json_object_output_parses(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, response_format={"type": "json_object"},
                                       max_tokens=24, temperature=0)
    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":
        json.loads(text)
    else:  # cut at max_tokens: what there is must still be a JSON object's beginning
        assert text.lstrip().startswith("{")


def test_json_schema_output_validates_chat_and_completions(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "cat", "schema": CAT, "strict": True}}
    r = client.chat.completions.create(model=MODEL, messages=ASK, response_format=fmt, max_tokens=60, temperature=0)
    assert r.choices[0].finish_reason == "stop"  # the grammar's end ends the request
    check_cat(r.choices[0].message.content)
    r = client.completions.create(model=MODEL, prompt="A cat, as JSON:", max_tokens=60, temperature=0.7, seed=4,
                                  extra_body={"response_format": fmt})
    assert r.choices[0].finish_reason == "stop"
    check_cat(r.choices[0].text)


def test_guided_regex_and_choice_match(client):
    r = client.completions.create(model=MODEL, prompt="Call me at", max_tokens=12, temperature=0.9, seed=1,
                                  extra_body={"guided_regex": r"\d{3}-\d{4}"})
    assert re.fullmatch(r"\d{3}-\d{4}", r.choices[0].text) and r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Is the sky green?"}],
                                       max_tokens=5, temperature=1.0, n=3, seed=2,
                                       extra_body={"guided_choice": ["yes", "no", "maybe not"]})
    assert {c.message.content for c in r.choices} <= {"yes", "no", "maybe not"}


def test_guided_grammar_ebnf(client):
    grammar = 'root ::= "ab" digits\ndigits ::= [0-9] | [0-9] digits'
    r = client.completions.create(model=MODEL, prompt="Code:", max_tokens=6, temperature=0,
                                  extra_body={"guided_grammar": grammar})
    assert re.fullmatch(r"ab[0-9]+", r.choices[0].text)


def test_streaming_with_n2_gives_each_sample_its_own_matcher(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "cat", "schema": CAT}}
    chunks = client.chat.completions.create(model=MODEL, messages=ASK, response_format=fmt, max_tokens=60, n=2,
                                            temperature=1.0, seed=7, stream=True)
    texts, reasons = ["", ""], [None, None]
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] += c.delta.content or ""
            reasons[c.index] = c.finish_reason or reasons[c.index]
    assert reasons == ["stop", "stop"]
    for text in texts:
        check_cat(text)


def test_a_batch_mixes_requests_with_and_without_grammars(aclient):
    async def run():
        guided = aclient.completions.create(model=MODEL, prompt="Digits:", max_tokens=8, temperature=0,
                                            extra_body={"guided_regex": "[0-9]{8}"})
        plain = aclient.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8,
                                           temperature=0)
        return await asyncio.gather(guided, plain, guided, plain)

    g1, p1, g2, p2 = asyncio.run(run())
    assert re.fullmatch("[0-9]{8}", g1.choices[0].text) and g1.choices[0].text == g2.choices[0].text
    assert p1.choices[0].text == p2.choices[0].text and not re.fullmatch("[0-9]{8}", p1.choices[0].text)


def test_logit_bias_forces_and_bans_a_token(server, client):
    forced = httpx.post(f"{server.url}/tokenize", json={"prompt": " banana", "add_special_tokens": False},
                        headers=server.headers).json()["tokens"][-1]
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0,
                                  logit_bias={str(forced): 100}, logprobs=0)
    assert r.choices[0].text == httpx.post(f"{server.url}/detokenize", json={"tokens": [forced] * 4},
                                           headers=server.headers).json()["prompt"]
    first = client.completions.create(model=MODEL, prompt="Hello", max_tokens=1, temperature=0,
                                      logprobs=0).choices[0].logprobs.tokens[0]
    first_id = httpx.post(f"{server.url}/tokenize", json={"prompt": first, "add_special_tokens": False},
                          headers=server.headers).json()["tokens"][0]
    banned = client.completions.create(model=MODEL, prompt="Hello", max_tokens=1, temperature=0,
                                       logit_bias={str(first_id): -100})
    assert banned.choices[0].text != first


def test_generate_takes_sglang_fields(server):
    body = {"text": "Number:", "sampling_params": {"regex": "[1-9][0-9]{2}", "max_new_tokens": 6, "temperature": 0}}
    r = httpx.post(f"{server.url}/generate", json=body, headers=server.headers, timeout=120)
    assert r.status_code == 200 and re.fullmatch("[1-9][0-9]{2}", r.json()["text"])
    assert r.json()["meta_info"]["finish_reason"] == "stop"
    body = {"text": "Hi", "sampling_params": {"logit_bias": {"42": 100}, "max_new_tokens": 2, "temperature": 0}}
    assert httpx.post(f"{server.url}/generate", json=body, headers=server.headers, timeout=120).json()[
        "output_ids"] == [42, 42]


MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("path", "extra", "param"), [
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "nope"}}}}, "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format.type"),
    ("/v1/completions", {"guided_regex": "(unclosed"}, "guided_regex"),
    ("/v1/completions", {"guided_grammar": "root ::= missing"}, "guided_grammar"),
    ("/v1/completions", {"guided_choice": []}, "guided_choice"),
    ("/v1/completions", {"guided_json": "{not json"}, "guided_json"),
    ("/v1/completions", {"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ("/v1/completions", {"logit_bias": {"abc": 1}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"99999999": 1}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"-1": 1}}, "logit_bias"),
    ("/v1/chat/completions", {"logit_bias": {"5": 101}}, "logit_bias"),
    ("/v1/chat/completions", {"logit_bias": {"5": "up"}}, "logit_bias"),
    ("/v1/completions", {"seed": 2**64}, "seed"),
    ("/v1/chat/completions", {"seed": -(2**63) - 1}, "seed"),
    ("/generate", {"sampling_params": {"regex": "(("}}, "sampling_params.regex"),
    ("/generate", {"sampling_params": {"logit_bias": {"x": 1}}}, "logit_bias"),
])
def test_bad_constraints_answer_400_naming_the_field(server, path, extra, param):
    body = {"model": MODEL, "max_tokens": 2, **extra}
    if path == "/generate":
        body = {"text": "hi", **extra}
    elif path == "/v1/chat/completions":
        body["messages"] = MSG
    else:
        body["prompt"] = "hi"
    r = httpx.post(f"{server.url}{path}", json=body, headers=server.headers, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
