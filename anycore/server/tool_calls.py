"""Tool calling on /v1/chat/completions: ``tools``, ``tool_choice``, ``parallel_tool_calls``.

The tools reach the model through its chat template (``tools=``, as transformers passes them).
A template that never reads ``tools`` gets them from anycore instead, as a system-prompt block in
the Hermes format (``TOOLS_PROMPT`` below: the tools' JSON inside ``<tools>``, calls answered as
``<tool_call>{"name": .., "arguments": {..}}</tool_call>``), and the conversation's earlier
calls and results are written in that format too (a tool result as a user turn inside
``<tool_response>``), so any chat model can be asked.

``tool_choice``: "none" leaves the tools out; "auto" (the default with tools) lets the model
choose, and its output is parsed by the model's ToolParser (tool_parsers/); "required" and a
named function are enforced by the grammar engine: the output is a JSON array of
``{"name", "arguments"}`` objects (one of the tools each, arguments matching that tool's
parameters), or the named function's arguments object, so it always parses. Under "auto", a
tool with ``strict: true`` makes any call the model begins follow its tool's schema (an xgrammar
structural tag triggered by the parser's call marker); its text stays free.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from anycore.engine.grammar import StructuredOutput
from anycore.errors import InvalidParameter
from anycore.server.protocol import ChatCompletionRequest, NamedToolChoice
from anycore.server.tool_parsers import ParsedOutput, ToolCall, ToolParser, choose_parser

TOOLS_PROMPT = """# Tools

You may call one or more functions to help with the user's request. The functions are described \
in JSON Schema inside <tools></tools>:
<tools>
{tools}
</tools>

To call a function, reply with one JSON object per call inside <tool_call></tool_call> tags:
<tool_call>
{{"name": <function name>, "arguments": <arguments object>}}
</tool_call>"""

Mode = Literal["auto", "required", "named"]


def template_reads_tools(template: str | None) -> bool:
    """Whether the chat template renders a ``tools`` variable itself."""
    return bool(template) and re.search(r"\btools\b", template) is not None


def _call_text(call: dict[str, Any]) -> str:
    fn = call["function"]
    return "<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": fn["arguments"]}, ensure_ascii=False) \
        + "\n</tool_call>"


def prepare_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                     template: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The conversation and the ``tools=`` argument for this template: passed through when the
    template reads tools; otherwise the tools become a system block and the calls and results
    plain text (see the module doc)."""
    if template_reads_tools(template):
        return messages, tools
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["content"] = "\n".join([m["content"]] * bool(m["content"]) + [_call_text(c) for c in m.pop("tool_calls")])
        if m["role"] == "tool":
            m = {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
        out.append(m)
    if tools:
        block = TOOLS_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out, None


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolPlan:
    """What this request's tools mean for its prompt, its grammar and its output."""

    tools: list[dict[str, Any]]  # OpenAI tool objects, for the template
    mode: Mode
    parser: ToolParser
    named: str | None = None
    parallel: bool = True
    _schemas: dict[str, dict[str, Any]] = field(default_factory=dict)
    strict: bool = False  # a tool asked for strict arguments ("auto": enforced by a structural tag)

    def structured_output(self) -> StructuredOutput | None:
        """The grammar that enforces "required" or a named function, or under "auto" with a
        strict tool a structural tag: free text, but once a call begins (the parser's trigger)
        it must name a tool and its arguments must match that tool's schema. None otherwise."""
        if self.mode == "named":
            assert self.named is not None
            return StructuredOutput("json_schema", self._schemas[self.named], param="tool_choice")
        if self.mode == "required":
            items = [{"type": "object", "properties": {"name": {"const": name}, "arguments": schema},
                      "required": ["name", "arguments"], "additionalProperties": False}
                     for name, schema in self._schemas.items()]
            array: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
            if not self.parallel:
                array["maxItems"] = 1
            return StructuredOutput("json_schema", array, param="tool_choice")
        if self.strict:
            p = self.parser
            tags = [{"begin": p.strict_begin(name), "schema": schema, "end": p.strict_end}
                    for name, schema in self._schemas.items()]
            return StructuredOutput("structural_tag", {"tags": tags, "triggers": [p.strict_trigger]}, param="tools")
        return None

    def parse(self, text: str) -> ParsedOutput:
        """The calls in a finished output (its text when it holds none); only the first one
        without parallel_tool_calls."""
        parsed = self._parse(text)
        if not self.parallel:
            parsed.calls = parsed.calls[:1]
        return parsed

    def _parse(self, text: str) -> ParsedOutput:
        if self.mode == "named":
            assert self.named is not None
            try:
                json.loads(text)
            except ValueError:  # cut short (max_tokens): not a call
                return ParsedOutput(text)
            return ParsedOutput(None, [ToolCall(self.named, text)])
        if self.mode == "required":
            try:
                items = json.loads(text)
                return ParsedOutput(None, [ToolCall(c["name"], json.dumps(c["arguments"], ensure_ascii=False))
                                           for c in items])
            except (ValueError, TypeError, KeyError):
                return ParsedOutput(text)
        return self.parser.parse(text)

    def message(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        """The assistant message of a finished choice, and its finish reason ("tool_calls" when
        it called tools)."""
        parsed = self.parse(text)
        if not parsed.calls:
            return {"role": "assistant", "content": text}, finish_reason
        calls = [{"id": new_call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                 for c in parsed.calls]
        return {"role": "assistant", "content": parsed.content, "tool_calls": calls}, _reason(finish_reason)

    def streamer(self) -> ToolStreamer:
        return ToolStreamer(self)


def _reason(finish_reason: str | None) -> str | None:
    return "tool_calls" if finish_reason == "stop" else finish_reason


def _call_deltas(calls: list[ToolCall], first_index: int = 0) -> list[dict[str, Any]]:
    return [{"index": first_index + i, "id": new_call_id(), "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for i, c in enumerate(calls)]


class ToolStreamer:
    """One streamed choice's deltas: content as it comes until a call may begin, then the calls
    in OpenAI's delta shape (``tool_calls: [{index, id, type, function: {name, arguments}}]``).
    A named function streams its arguments as they are generated; "auto" and "required" calls
    are sent whole once the output ends (the text of an "auto" output without calls is sent then)."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self.sent = 0  # characters of ``text`` already sent as content
        self.named_started = False
        self.holding = False  # "auto": a call may have begun at ``sent``

    def feed(self, delta: str) -> list[dict[str, Any]]:
        """Deltas for this piece of output."""
        self.text += delta
        plan = self.plan
        if plan.mode == "named":
            out = []
            if not self.named_started:
                self.named_started = True
                out.append({"tool_calls": [{"index": 0, "id": new_call_id(), "type": "function",
                                            "function": {"name": plan.named, "arguments": ""}}]})
            if delta:
                out.append({"tool_calls": [{"index": 0, "function": {"arguments": delta}}]})
            return out
        if plan.mode == "required" or self.holding:
            return []
        start = _hold_from(self.text, self.sent, plan.parser)
        safe = len(self.text) if start is None else start
        out = [{"content": self.text[self.sent:safe]}] if safe > self.sent else []
        self.sent = max(self.sent, safe)
        if start is not None and self.text.startswith(plan.parser.start_markers, start):
            self.holding = True  # a whole marker: from here on it is the call's
        return out

    def finish(self, finish_reason: str | None) -> tuple[list[dict[str, Any]], str | None]:
        """The last deltas once the output ended, and the choice's finish reason."""
        plan = self.plan
        if plan.mode == "named":
            parsed = plan.parse(self.text)
            return [], _reason(finish_reason) if parsed.calls else finish_reason
        rest = self.text[self.sent:]
        parsed = plan.parse(rest)
        if not parsed.calls:
            return ([{"content": rest}] if rest else []), finish_reason
        out = [{"content": parsed.content}] if parsed.content else []
        out.append({"tool_calls": _call_deltas(parsed.calls)})
        return out, _reason(finish_reason)


def _hold_from(text: str, sent: int, parser: ToolParser) -> int | None:
    """Where a tool call may begin in ``text`` (at or after ``sent``): a start marker, or a tail
    that is the beginning of one; None when the text holds neither."""
    where = parser.call_start(text, sent)
    if where is not None:
        return where
    for marker in parser.start_markers:
        for k in range(min(len(marker) - 1, len(text) - sent), 0, -1):
            if text.endswith(marker[:k]):
                return len(text) - k
    return None


def plan_tools(body: ChatCompletionRequest, parser_name: str | None, template: str | None) -> ToolPlan | None:
    """The request's ToolPlan; None when it names no tools or tool_choice is "none"; 400 for
    the combinations that cannot be served."""
    choice = body.tool_choice
    tools = body.tools or []
    if not tools:
        if isinstance(choice, NamedToolChoice) or choice == "required":
            raise InvalidParameter(f"tool_choice {_choice_text(choice)} needs a non-empty 'tools' list",
                                   param="tool_choice")
        return None
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise InvalidParameter("tool function names must be unique", param="tools")
    if choice == "none":
        return None
    schemas = {t.function.name: t.function.parameters or {"type": "object"} for t in tools}
    for name, schema in schemas.items():
        if not isinstance(schema, dict):
            raise InvalidParameter(f"the parameters of tool {name!r} must be a JSON schema object", param="tools")
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in schemas:
            raise InvalidParameter(f"tool_choice names function {choice.function.name!r}, which is not in 'tools'",
                                   param="tool_choice")
        mode: Mode = "named"
    else:
        mode = "required" if choice == "required" else "auto"
    strict = any(t.function.strict for t in tools)
    if (mode != "auto" or strict) and body.structured_output() is not None:
        raise InvalidParameter("a required or named tool_choice, or a strict tool, cannot be combined with "
                               "another output constraint", param="response_format")
    return ToolPlan([t.model_dump(exclude_none=True) for t in tools], mode, choose_parser(parser_name, template),
                    choice.function.name if isinstance(choice, NamedToolChoice) else None,
                    body.parallel_tool_calls, schemas, strict)


def _choice_text(choice: Any) -> str:
    return repr(choice) if isinstance(choice, str) else f"{{'function': {{'name': {choice.function.name!r}}}}}"
