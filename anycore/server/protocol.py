"""Pydantic request models at the HTTP edge (OpenAI schema plus vLLM/SGLang extras).

Ranges that OpenAI documents are checked here so a bad field answers 400 naming that field;
everything else is checked by ``SamplingParams.validate`` when ``to_sampling_params`` builds it.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from anycore.errors import InvalidParameter, InvalidRequest
from anycore.sampling_params import SamplingParams
from anycore.server.structured import GuidedFields, logit_bias_ids, sglang_structured_output

log = logging.getLogger("anycore.server")


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


_ABSENT = object()
# Fields the request router (server/router_proc.py) adds to every forwarded body, each at the
# value that asks for exactly what this server does anyway (no reasoning parser: reasoning is
# part of the content; stop strings trimmed; no hidden states; no continued final message). At
# these values they are not "unknown" in the log; any other value still is.
ROUTER_NEUTRAL_FIELDS: dict[str, object] = {
    "no_stop_trim": False, "return_hidden_states": False, "continue_final_message": False,
    "separate_reasoning": True, "stream_reasoning": True, "include_reasoning": True,
}


class _TopLevel:
    """Mixed into the endpoint bodies: fields this schema does not know are kept (pydantic's
    ``extra="allow"``) so they can be named in the log instead of vanishing without a trace, as
    vLLM does (an unknown field may be a typo, or a feature some other server has). Each
    endpoint body sets ``model_config = ConfigDict(extra="allow")`` itself (pydantic reads it
    from BaseModel classes only)."""

    def log_unknown_fields(self, endpoint: str) -> None:
        extra = sorted(k for k, v in (getattr(self, "model_extra", None) or {}).items()
                       if ROUTER_NEUTRAL_FIELDS.get(k, _ABSENT) != v)
        if extra:
            log.warning("%s: request fields not known to this server, ignored: %s", endpoint, ", ".join(extra))


class StreamOptions(_Model):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: usage (running counts) on every chunk; needs include_usage


class SamplingFields(GuidedFields):
    """Fields shared by /v1/chat/completions and /v1/completions (with the structured-output
    ones of GuidedFields: response_format, guided_json/regex/choice/grammar)."""

    model: str | None = None
    n: int = Field(1, ge=1, le=64)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM / SGLang extras
    top_k: int | None = None
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # vLLM: each prompt token's logprob plus the top-k at its position, returned as
    # ``prompt_logprobs`` (per choice on completions, on the response for chat)
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    logit_bias: dict[str, Any] | None = None
    # anycore: false keeps this request out of speculative decoding (when the server runs it)
    speculative: bool = True

    def to_sampling_params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        """OpenAI's unset temperature/top_p/top_k mean 1, 1 and off; raises InvalidParameter."""
        return SamplingParams(
            n=self.n,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None else self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            seed=self.seed,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids or [],
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=self.prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logit_bias=logit_bias_ids(self.logit_bias),
            structured_output=self.structured_output(),
            speculative=self.speculative,
        )


class TextPart(_Model):
    type: str
    text: str | None = None


class FunctionCall(_Model):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallIn(_Model):
    """A tool call of an earlier assistant turn, sent back in ``messages``."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Model):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # assistant turns that called tools
    tool_call_id: str | None = None  # role "tool": the call this is the result of

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template takes it (text parts joined by newlines; tool
        calls with their arguments as objects, as templates index them)."""
        out: dict[str, Any] = {"role": self.role, "content": self._text()}
        if self.role == "tool":
            if not self.tool_call_id:
                raise InvalidRequest("a 'tool' message needs the tool_call_id it answers", param="messages")
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            if self.role != "assistant":
                raise InvalidRequest("only assistant messages carry tool_calls", param="messages")
            calls = []
            for c in self.tool_calls:
                try:
                    args = json.loads(c.function.arguments) if c.function.arguments.strip() else {}
                except ValueError as e:
                    raise InvalidParameter(f"tool call {c.id!r}: arguments are not valid JSON: {e}",
                                           param="messages") from e
                calls.append({"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": args}})
            out["tool_calls"] = calls
        return out

    def _text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for p in self.content:
            if p.type != "text" or p.text is None:
                raise InvalidRequest(f"unsupported content part type {p.type!r}; only 'text' parts are supported",
                                     param="messages")
            parts.append(p.text)
        return "\n".join(parts)


class FunctionDef(_Model):
    name: str = Field(..., min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: bool | None = None


class ToolDef(_Model):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(_Model):
    name: str


class NamedToolChoice(_Model):
    type: Literal["function"] = "function"
    function: NamedFunction


class ChatCompletionRequest(_TopLevel, SamplingFields):
    model_config = ConfigDict(extra="allow")
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    add_generation_prompt: bool = True
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    # OpenAI fields this server does not implement: set, they get 400 naming them (ignoring them
    # would hand back something other than what was asked for: audio, a predicted output, web
    # search, the legacy function-calling fields, reasoning controls for a model without them)
    audio: Any = None
    modalities: list[str] | None = None  # ["text"] is what every answer is, so that one is fine
    prediction: Any = None
    web_search_options: Any = None
    functions: Any = None
    function_call: Any = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    # OpenAI platform bookkeeping with no effect on the output; accepted and not used, as vLLM
    # does: metadata, store, service_tier, prompt_cache_key, safety_identifier (and `user`)

    def check_unsupported(self) -> None:
        """Raises InvalidRequest (400, naming the field) for a set field this server does not implement."""
        for name in ("audio", "prediction", "web_search_options", "functions", "function_call",
                     "reasoning_effort", "verbosity"):
            if getattr(self, name) is not None:
                hint = "; use tools and tool_choice" if name.startswith("function") else ""
                raise InvalidRequest(f"{name} is not supported by this server{hint}", param=name)
        if self.modalities is not None and any(m != "text" for m in self.modalities):
            raise InvalidRequest("only the 'text' modality is supported", param="modalities")


class CompletionRequest(_TopLevel, SamplingFields):
    model_config = ConfigDict(extra="allow")
    prompt: str | list[str] | list[int] | list[list[int]]
    # OpenAI's default for completions; 0 (only with echo) scores the prompt without generating
    max_tokens: int | None = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)


class NativeSamplingParams(_Model):
    """``sampling_params`` of /generate: SamplingParams names; SGLang's max_new_tokens also accepted."""

    max_new_tokens: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[str, Any] | None = None
    # SGLang's structured output: at most one of these
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    speculative: bool = True  # false: never decoded speculatively

    def to_sampling_params(self) -> SamplingParams:
        """Unset max_new_tokens / max_tokens mean 16 tokens (SGLang's default)."""
        max_tokens = self.max_new_tokens if self.max_new_tokens is not None else (self.max_tokens or 16)
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
            repetition_penalty=self.repetition_penalty, frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty, seed=self.seed, max_tokens=max_tokens, min_tokens=self.min_tokens,
            stop=self.stop, stop_token_ids=self.stop_token_ids or [], ignore_eos=self.ignore_eos,
            logprobs=self.logprobs, skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logit_bias=logit_bias_ids(self.logit_bias),
            structured_output=sglang_structured_output(self.json_schema, self.regex, self.ebnf),
            speculative=self.speculative,
        )


class GenerateRequest(_Model):
    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: NativeSamplingParams = Field(default_factory=NativeSamplingParams)
    stream: bool = False
    rid: str | None = None


class TokenizeRequest(_Model):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False  # vLLM: also answer the tokens' vocabulary strings (token_strs)


class DetokenizeRequest(_Model):
    model: str | None = None
    tokens: list[int]
