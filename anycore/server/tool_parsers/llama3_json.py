"""Llama 3.x JSON style: the whole output is one or more ``{"name": .., "parameters": {..}}``
objects (separated by ``;`` or whitespace), optionally after ``<|python_tag|>``. Output that is
not entirely such objects is content."""

from __future__ import annotations

import json

from anycore.server.tool_parsers.base import ParsedOutput, ToolParser, call_from_json

_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    start_markers = (_TAG, "{")
    strict_trigger = '{"name": '
    strict_end = "}"

    def strict_begin(self, name: str) -> str:
        return '{"name": ' + json.dumps(name) + ', "parameters": '

    def call_start(self, text: str, start: int) -> int | None:
        """Only the whole output is a call: it starts one when its first non-space text does."""
        body = text.lstrip()
        if not text[:start].strip() and body.startswith(self.start_markers):
            return len(text) - len(body)
        return None

    def parse(self, text: str) -> ParsedOutput:
        body = text.strip()
        if body.startswith(_TAG):
            body = body[len(_TAG):].lstrip()
        if not body.startswith("{"):
            return ParsedOutput(text)
        decoder = json.JSONDecoder()
        calls, pos = [], 0
        while pos < len(body):
            try:
                obj, end = decoder.raw_decode(body, pos)
            except ValueError:
                return ParsedOutput(text)
            call = call_from_json(obj)
            if call is None:
                return ParsedOutput(text)
            calls.append(call)
            pos = end
            while pos < len(body) and (body[pos].isspace() or body[pos] == ";"):
                pos += 1
        return ParsedOutput(None, calls)
