"""The request fields that constrain the output, turned into one StructuredOutput.

OpenAI's ``response_format`` ({"type": "text" | "json_object" | "json_schema"}, and vLLM's
"structural_tag"), vLLM's
``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` (EBNF) and
SGLang's ``json_schema`` / ``regex`` / ``ebnf`` (in /generate's sampling_params); a request
may name at most one. ``logit_bias`` keys arrive as JSON strings and become token ids here.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from anycore.engine.grammar import StructuredOutput
from anycore.errors import InvalidParameter


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class JsonSchemaFormat(_Model):
    name: str = Field("response", max_length=64)
    description: str | None = None
    # "schema" shadows a BaseModel attribute, hence the alias
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # output always matches the schema here, strict or not


class ResponseFormat(_Model):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    # vLLM's "structural_tag" format: [{"begin", "schema", "end"}] entered after a trigger
    structures: list[dict[str, Any]] | None = None
    triggers: list[str] | None = None


class GuidedFields(_Model):
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    def structured_output(self) -> StructuredOutput | None:
        """The one constraint these fields name, or None; 400 naming the field when two are
        given or one is malformed (a spec that does not compile fails later, in compiling)."""
        found: list[StructuredOutput] = []
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            found.append(StructuredOutput("json_object", param="response_format"))
        elif rf is not None and rf.type == "json_schema":
            if rf.json_schema is None:
                raise InvalidParameter("response_format type 'json_schema' needs a 'json_schema' object",
                                       param="response_format")
            schema = rf.json_schema.schema_ if rf.json_schema.schema_ is not None else {}
            found.append(StructuredOutput("json_schema", schema, param="response_format"))
        elif rf is not None and rf.type == "structural_tag":
            found.append(StructuredOutput("structural_tag", {"tags": rf.structures, "triggers": rf.triggers},
                                          param="response_format"))
        if self.guided_json is not None:
            found.append(StructuredOutput("json_schema", self.guided_json, param="guided_json"))
        if self.guided_regex is not None:
            found.append(StructuredOutput("regex", self.guided_regex, param="guided_regex"))
        if self.guided_choice is not None:
            found.append(StructuredOutput("choice", self.guided_choice, param="guided_choice"))
        if self.guided_grammar is not None:
            found.append(StructuredOutput("ebnf", self.guided_grammar, param="guided_grammar"))
        return _one(found)


def sglang_structured_output(json_schema: str | None, regex: str | None, ebnf: str | None) -> StructuredOutput | None:
    found = []
    if json_schema is not None:
        found.append(StructuredOutput("json_schema", json_schema, param="sampling_params.json_schema"))
    if regex is not None:
        found.append(StructuredOutput("regex", regex, param="sampling_params.regex"))
    if ebnf is not None:
        found.append(StructuredOutput("ebnf", ebnf, param="sampling_params.ebnf"))
    return _one(found)


def _one(found: list[StructuredOutput]) -> StructuredOutput | None:
    if len(found) > 1:
        raise InvalidParameter(f"give at most one output constraint; got {', '.join(f.param for f in found)}",
                               param=found[1].param)
    return found[0] if found else None


def logit_bias_ids(bias: dict[str, Any] | None, param: str = "logit_bias") -> dict[int, float] | None:
    """``{"token id": value}`` as ``{token id: value}``; the range of the ids is checked against
    the vocabulary by the InputProcessor, the values by SamplingParams."""
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        try:
            tid = int(key)
        except ValueError:
            raise InvalidParameter(f"logit_bias keys must be token ids (integers); got {key!r}", param=param) from None
        if (not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value)
                or not -100 <= value <= 100):
            raise InvalidParameter(f"logit_bias values must be numbers in [-100, 100]; got {value!r} for {key}",
                                   param=param)
        out[tid] = float(value)
    return out
