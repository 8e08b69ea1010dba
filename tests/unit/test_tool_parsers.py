"""Tool-call parsers on crafted outputs (the default model rarely calls a tool by itself)."""

from __future__ import annotations

import json

import pytest

from anycore.server.tool_parsers import choose_parser
from anycore.server.tool_parsers.hermes import HermesToolParser
from anycore.server.tool_parsers.llama3_json import Llama3JsonToolParser


def test_hermes_reads_every_block_and_keeps_the_text_around_them():
    out = HermesToolParser().parse(
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    assert out.content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == [("get_weather", {"city": "Paris"}),
                                                                       ("get_time", {})]


def test_hermes_takes_an_unclosed_last_block_and_arguments_as_text():
    out = HermesToolParser().parse('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}')
    assert out.content is None
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == [("f", {"x": 1})]


@pytest.mark.parametrize("text", ["no calls here", "<tool_call>{not json}</tool_call>",
                                  '<tool_call>{"arguments": {}}</tool_call>'])
def test_hermes_leaves_other_output_as_content(text):
    out = HermesToolParser().parse(text)
    assert out.calls == [] and out.content == text


def test_llama3_json_reads_one_or_more_objects():
    out = Llama3JsonToolParser().parse('<|python_tag|>{"name": "a", "parameters": {"q": 1}}; '
                                       '{"name": "b", "parameters": {}}')
    assert out.content is None
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == [("a", {"q": 1}), ("b", {})]


@pytest.mark.parametrize("text", ["Sure: {\"name\": \"a\", \"parameters\": {}}", '{"name": "a", "parameters": {}} trailing',
                                  '{"answer": 42}'])
def test_llama3_json_needs_the_whole_output_to_be_calls(text):
    out = Llama3JsonToolParser().parse(text)
    assert out.calls == [] and out.content == text


def test_call_start_finds_where_a_call_may_begin():
    assert HermesToolParser().call_start("abc <tool_call>{", 0) == 4
    assert HermesToolParser().call_start("abc", 0) is None
    assert Llama3JsonToolParser().call_start('  {"name"', 0) == 2
    assert Llama3JsonToolParser().call_start('so {"name"', 0) is None


def test_the_parser_is_chosen_by_flag_or_by_template():
    assert choose_parser("llama3_json", "<tool_call>").name == "llama3_json"
    assert choose_parser("auto", "{{ '<|python_tag|>' }} ipython").name == "llama3_json"
    assert choose_parser("auto", "{% if tools %}<tool_call>{% endif %}").name == "hermes"
    assert choose_parser(None, None).name == "hermes"  # anycore's own tools block is Hermes style


def test_every_parser_is_a_tool_call_parser_choice():
    from anycore.config import TOOL_CALL_PARSERS, ServerConfig
    from anycore.server.tool_parsers import PARSERS

    assert set(TOOL_CALL_PARSERS) == {"auto", *PARSERS}
    with pytest.raises(ValueError, match="tool_call_parser"):
        ServerConfig(tool_call_parser="mistral")
