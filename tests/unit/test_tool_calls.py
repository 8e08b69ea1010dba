"""server/tool_calls.py without a model: tool_choice planning and its 400s, the prompt for
templates that know no tools, the grammar of required/named choices, streamed deltas."""

from __future__ import annotations

import json

import pytest

from anycore.errors import InvalidParameter
from anycore.server.protocol import ChatCompletionRequest
from anycore.server.tool_calls import ToolPlan, plan_tools, prepare_messages, template_reads_tools
from anycore.server.tool_parsers import choose_parser

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
USER = [{"role": "user", "content": "hi"}]


def body(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=USER, **kw)


def plan(**kw) -> ToolPlan:
    p = plan_tools(body(**kw), "auto", None)
    assert p is not None
    return p


@pytest.mark.parametrize(("kw", "param"), [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
])
def test_bad_combinations_name_the_field(kw, param):
    with pytest.raises(InvalidParameter) as e:
        plan_tools(body(**kw), "auto", None)
    assert e.value.param == param


def test_no_tools_or_choice_none_means_no_plan():
    assert plan_tools(body(), "auto", None) is None
    assert plan_tools(body(tool_choice="auto"), "auto", None) is None
    assert plan_tools(body(tools=[WEATHER], tool_choice="none"), "auto", None) is None
    assert plan(tools=[WEATHER]).mode == "auto" and plan(tools=[WEATHER]).structured_output() is None


def test_required_and_named_choices_are_grammars_of_the_tools_parameters():
    named = plan(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.structured_output().spec == WEATHER["function"]["parameters"]
    required = plan(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    schema = required.structured_output().spec
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 1
    names = [item["properties"]["name"]["const"] for item in schema["items"]["anyOf"]]
    assert names == ["get_weather", "get_time"]
    assert schema["items"]["anyOf"][1]["properties"]["arguments"] == {"type": "object"}


def test_required_output_parses_into_calls_with_tool_calls_finish_reason():
    p = plan(tools=[WEATHER], tool_choice="required")
    msg, reason = p.message('[{"name": "get_weather", "arguments": {"city": "Oslo"}}]', "stop")
    assert reason == "tool_calls" and msg["content"] is None
    (call,) = msg["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    msg, reason = p.message('[{"name": "get_wea', "length")  # cut short: plain text
    assert reason == "length" and msg["content"] == '[{"name": "get_wea' and "tool_calls" not in msg


def test_a_template_without_tools_gets_them_as_a_system_block():
    convo = [{"role": "system", "content": "Be brief."}, *USER,
             {"role": "assistant", "content": "", "tool_calls": [
                 {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
             {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}]
    out, tools = prepare_messages(convo, [WEATHER], "{{ messages }}")
    assert tools is None
    assert out[0]["content"].startswith("Be brief.\n\n# Tools") and '"get_weather"' in out[0]["content"]
    assert "tool_calls" not in out[2]
    assert json.loads(out[2]["content"].split("<tool_call>\n")[1].split("\n</tool_call>")[0]) == {
        "name": "get_weather", "arguments": {"city": "Rome"}}
    assert out[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}
    passed, tools = prepare_messages(convo, [WEATHER], "{% for t in tools %}{{ t }}{% endfor %}")
    assert passed is convo and tools == [WEATHER]
    assert template_reads_tools("{%- if tools %}") and not template_reads_tools("{{ toolset }}")


def assemble(deltas: list[dict]) -> tuple[str, dict[int, dict]]:
    """OpenAI's client-side rule: content concatenates; tool_calls merge by index."""
    content, calls = "", {}
    for d in deltas:
        content += d.get("content") or ""
        for tc in d.get("tool_calls", []):
            c = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
            c["id"] = tc.get("id") or c["id"]
            fn = tc.get("function", {})
            c["name"] += fn.get("name") or ""
            c["arguments"] += fn.get("arguments") or ""
    return content, calls


def stream(p: ToolPlan, pieces: list[str], reason: str = "stop") -> tuple[list[dict], str | None]:
    s = p.streamer()
    deltas = [d for piece in pieces for d in s.feed(piece)]
    last, final = s.finish(reason)
    return deltas + last, final


def test_auto_streams_content_then_the_call_whole():
    p = plan(tools=[WEATHER])
    text = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
    deltas, reason = stream(p, pieces)
    content, calls = assemble(deltas)
    assert reason == "tool_calls" and content == "Checking.\n"
    assert calls[0]["name"] == "get_weather" and json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert not any("<tool" in (d.get("content") or "") for d in deltas)


def test_auto_without_a_call_streams_everything_as_content():
    p = plan(tools=[WEATHER])
    deltas, reason = stream(p, ["a <to", "ol and more", " text <tool"])
    assert assemble(deltas) == ("a <tool and more text <tool", {}) and reason == "stop"


def test_named_streams_its_arguments_as_they_come():
    p = plan(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    deltas, reason = stream(p, ['{"ci', 'ty": "Lima"', "}"])
    content, calls = assemble(deltas)
    assert content == "" and reason == "tool_calls"
    assert calls[0]["id"].startswith("call_") and calls[0]["name"] == "get_weather"
    assert calls[0]["arguments"] == '{"city": "Lima"}'
    assert p.message('{"city": "Lima"}', "stop")[0]["tool_calls"][0]["function"]["arguments"] == '{"city": "Lima"}'


def test_required_streams_parallel_calls_by_index():
    p = plan(tools=[WEATHER, TIME], tool_choice="required")
    deltas, reason = stream(p, ['[{"name": "get_time", "arguments": {}}, ',
                                '{"name": "get_weather", "arguments": {"city": "Oslo"}}]'])
    _, calls = assemble(deltas)
    assert reason == "tool_calls" and [calls[i]["name"] for i in (0, 1)] == ["get_time", "get_weather"]
    assert calls[0]["id"] != calls[1]["id"]


def test_llama3_parser_plan_reads_json_output():
    p = plan_tools(body(tools=[WEATHER]), "llama3_json", None)
    assert p.parser.name == "llama3_json" and choose_parser("llama3_json", None).name == "llama3_json"
    msg, reason = p.message('{"name": "get_weather", "parameters": {"city": "Kyiv"}}', "stop")
    assert reason == "tool_calls" and msg["tool_calls"][0]["function"]["name"] == "get_weather"


def test_parallel_tool_calls_false_keeps_the_first_call():
    p = plan(tools=[WEATHER, TIME], parallel_tool_calls=False)
    text = ('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>')
    assert [c["function"]["name"] for c in p.message(text, "stop")[0]["tool_calls"]] == ["get_time"]


STRICT = {"type": "function", "function": {**WEATHER["function"], "strict": True}}


def test_a_strict_tool_under_auto_constrains_only_the_calls(tokenizer):
    pytest.importorskip("xgrammar")
    from anycore.engine.grammar import GrammarCompiler, GrammarMatcher

    so = plan(tools=[STRICT, TIME]).structured_output()
    assert so.kind == "structural_tag" and so.param == "tools"
    compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    compiled = compiler.compile(so)

    def accepts(text: str) -> bool:
        m = GrammarMatcher(compiled, len(tokenizer), [tokenizer.eos_token_id])
        return all(m.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))

    assert accepts("Any free text first. ")
    assert accepts('Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    assert not accepts('<tool_call>\n{"name": "get_weather", "arguments": {"town": 1}}')
    assert not accepts('<tool_call>\n{"name": "launch_rockets", "arguments": {}}')
    with pytest.raises(InvalidParameter) as e:
        plan_tools(body(tools=[STRICT], guided_regex="a"), "auto", None)
    assert e.value.param == "response_format"
