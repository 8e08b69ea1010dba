"""Tool-call parsers, one output format per module; ``choose_parser`` picks one per model."""

from __future__ import annotations

from anycore.server.tool_parsers.base import ParsedOutput, ToolCall, ToolParser
from anycore.server.tool_parsers.hermes import HermesToolParser
from anycore.server.tool_parsers.llama3_json import Llama3JsonToolParser

PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (HermesToolParser, Llama3JsonToolParser)}


def choose_parser(name: str | None, chat_template: str | None) -> ToolParser:
    """The parser named (``--tool-call-parser``), else the one the chat template writes calls in:
    Llama 3's ``<|python_tag|>`` / ipython role means its JSON style; anything else, including
    templates that know no tools (anycore then describes the tools in Hermes style itself), Hermes."""
    if name and name != "auto":
        return PARSERS[name]()
    template = chat_template or ""
    if "<tool_call>" not in template and ("<|python_tag|>" in template or "ipython" in template):
        return Llama3JsonToolParser()
    return HermesToolParser()


__all__ = ["PARSERS", "ParsedOutput", "ToolCall", "ToolParser", "choose_parser"]
