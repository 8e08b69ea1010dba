"""Hermes / Qwen style: ``<tool_call>{"name": .., "arguments": {..}}</tool_call>``, one block
per call, anywhere in the output; the text around the blocks is the message content."""

from __future__ import annotations

import json
import re

from anycore.server.tool_parsers.base import ParsedOutput, ToolParser, call_from_json

# a block; an unclosed last block (the output ended, e.g. at a stop token) counts too
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


class HermesToolParser(ToolParser):
    name = "hermes"
    start_markers = ("<tool_call>",)
    strict_trigger = "<tool_call>"
    strict_end = "}\n</tool_call>"

    def strict_begin(self, name: str) -> str:
        return '<tool_call>\n{"name": ' + json.dumps(name) + ', "arguments": '

    def parse(self, text: str) -> ParsedOutput:
        if "<tool_call>" not in text:
            return ParsedOutput(text)
        calls = []
        for m in _BLOCK.finditer(text):
            try:
                call = call_from_json(json.loads(m.group(1)))
            except ValueError:
                call = None
            if call is None:  # a malformed block: the whole output stays text
                return ParsedOutput(text)
            calls.append(call)
        content = _BLOCK.sub("", text).strip()
        return ParsedOutput(content or None, calls)
