"""What a tool-call parser returns, and the interface every output format implements."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text of the arguments object, as OpenAI returns it


@dataclass
class ParsedOutput:
    content: str | None  # the text outside the calls (None: nothing but calls)
    calls: list[ToolCall] = field(default_factory=list)


class ToolParser:
    """One model family's way of writing tool calls in its output text.

    ``start_markers``: strings that begin a call; a stream shows text up to the first of them
    and holds back a tail that could be the start of one."""

    name: str = ""
    start_markers: tuple[str, ...] = ()
    # strict tools under tool_choice "auto": after ``strict_trigger`` the output must be
    # ``strict_begin(name)`` + arguments matching the tool's schema + ``strict_end``
    strict_trigger: str = ""
    strict_end: str = ""

    def strict_begin(self, name: str) -> str:
        raise NotImplementedError

    def parse(self, text: str) -> ParsedOutput:
        raise NotImplementedError

    def call_start(self, text: str, start: int) -> int | None:
        """The first place at or after ``start`` where a call begins in ``text``, or None."""
        found = [i for m in self.start_markers if (i := text.find(m, start)) >= 0]
        return min(found) if found else None


def call_from_json(obj: Any) -> ToolCall | None:
    """``{"name": .., "arguments" | "parameters": {..}}`` as a ToolCall; None if it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as JSON text already
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))
