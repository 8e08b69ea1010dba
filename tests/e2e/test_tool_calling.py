"""Tool calling through the live server with the official openai client. The default model is
tiny, so its own "auto" choices are left to the parser unit tests; "required" and named
choices are grammar-enforced and must always come back as parseable tool_calls."""

from __future__ import annotations

import json

import httpx
import pytest

pytest.importorskip("xgrammar")

from tests.e2e.conftest import MODEL  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                         "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def check_weather(call) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    return args


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_required_and_named_choices_always_parse_into_tool_calls(client, choice):
    # "required" admits any number of calls, and at temperature 1 this tiny model sometimes keeps
    # adding them until max_tokens (finish "length", nothing to parse): the seed is one whose two
    # samples both stop within the budget (seeded draws do not depend on the batch)
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice=choice,
                                       max_tokens=60, temperature=1.0, seed=3, n=2)
    for c in r.choices:
        assert c.finish_reason == "tool_calls" and c.message.content is None
        assert c.message.tool_calls
        if choice == NAMED:
            (call,) = c.message.tool_calls
            check_weather(call)
        else:
            assert {t.function.name for t in c.message.tool_calls} <= {"get_weather", "get_time"}
            for t in c.message.tool_calls:
                json.loads(t.function.arguments)


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_streamed_tool_call_deltas_assemble_into_the_same_call(client, choice):
    kw = {"model": MODEL, "messages": ASK, "tools": [WEATHER], "tool_choice": choice, "max_tokens": 60,
          "temperature": 0, "parallel_tool_calls": False}
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
    calls: dict[int, dict] = {}
    reason = None
    for ch in client.chat.completions.create(**kw, stream=True):
        for c in ch.choices:
            reason = c.finish_reason or reason
            assert not c.delta.content
            for tc in c.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                entry["name"] += (tc.function.name or "") if tc.function else ""
                entry["arguments"] += (tc.function.arguments or "") if tc.function else ""
    assert reason == "tool_calls" and len(calls) == len(whole) == 1
    assert calls[0]["id"].startswith("call_") and calls[0]["name"] == whole[0].function.name == "get_weather"
    assert json.loads(calls[0]["arguments"]) == json.loads(whole[0].function.arguments)


def test_agent_round_trip_ends_with_an_answer(client):
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice=NAMED,
                                           max_tokens=60, temperature=0)
    msg = first.choices[0].message
    args = check_weather(msg.tool_calls[0])
    convo = [*ASK, {"role": "assistant", "content": None, "tool_calls": [tc.model_dump() for tc in msg.tool_calls]},
             {"role": "tool", "tool_call_id": msg.tool_calls[0].id,
              "content": json.dumps({"city": args["city"], "temperature": 18, "sky": "sunny"})}]
    final = client.chat.completions.create(model=MODEL, messages=convo, tools=[WEATHER], max_tokens=40,
                                           temperature=0, stop=["\n"])
    c = final.choices[0]
    assert c.finish_reason == "stop" and c.message.content and not c.message.tool_calls


def test_tool_choice_none_is_plain_chat(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none",
                                       max_tokens=8, temperature=0)
    plain = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, temperature=0)
    assert r.choices[0].message.content == plain.choices[0].message.content and not r.choices[0].message.tool_calls


@pytest.mark.parametrize(("extra", "param"), [
    ({"tool_choice": NAMED}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "launch"}}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name"),
    ({"tools": [WEATHER], "tool_choice": "required", "guided_regex": "a"}, "response_format"),
    ({"messages": [*ASK, {"role": "tool", "content": "x"}]}, "messages"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}, "messages"),
])
def test_bad_tool_requests_answer_400(server, extra, param):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 2, **extra}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=server.headers, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
