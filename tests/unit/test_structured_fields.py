"""server/structured.py and the SamplingParams checks behind it: which request fields become
which constraint, and the 400s (as InvalidParameter naming the field) for bad ones."""

from __future__ import annotations

import pytest

from anycore.engine.input_processor import InputProcessor
from anycore.errors import InvalidParameter
from anycore.sampling_params import SamplingParams
from anycore.server.protocol import CompletionRequest, NativeSamplingParams
from anycore.server.structured import logit_bias_ids


def so(**kw):
    return CompletionRequest(prompt="x", **kw).structured_output()


def test_each_field_becomes_its_constraint():
    assert so() is None and so(response_format={"type": "text"}) is None
    assert so(response_format={"type": "json_object"}).kind == "json_object"
    s = so(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}})
    assert (s.kind, s.spec, s.param) == ("json_schema", {"type": "object"}, "response_format")
    assert so(guided_json='{"type": "string"}').spec == {"type": "string"}
    assert (so(guided_regex="a+").kind, so(guided_choice=["a"]).kind, so(guided_grammar="root ::= \"a\"").kind) == (
        "regex", "choice", "ebnf")
    native = NativeSamplingParams(regex="[0-9]+").to_sampling_params().structured_output
    assert (native.kind, native.param) == ("regex", "sampling_params.regex")


def test_two_constraints_are_rejected_naming_the_second():
    with pytest.raises(InvalidParameter) as e:
        so(response_format={"type": "json_object"}, guided_regex="a")
    assert e.value.param == "guided_regex"


@pytest.mark.parametrize("bias", [{"x": 1}, {"1.5": 1}, {"3": 100.5}, {"3": "high"}, {"3": None}, {"3": True},
                                  {"3": float("nan")}])
def test_bad_logit_bias_names_the_field(bias):
    with pytest.raises(InvalidParameter) as e:
        logit_bias_ids(bias)
    assert e.value.param == "logit_bias"


def test_logit_bias_keys_become_token_ids():
    assert logit_bias_ids({"7": 5, "12": -100}) == {7: 5.0, 12: -100.0}
    assert logit_bias_ids({}) is None


def test_logit_bias_ids_are_checked_against_the_vocabulary():
    proc = InputProcessor(None, vocab_size=100, max_model_len=64)
    proc.process("r", [[1, 2]], SamplingParams(logit_bias={99: 1.0}))
    with pytest.raises(InvalidParameter) as e:
        proc.process("r", [[1, 2]], SamplingParams(logit_bias={100: 1.0}))
    assert e.value.param == "logit_bias"


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 1.5])
def test_seed_must_fit_a_signed_64_bit_integer(seed):
    with pytest.raises(InvalidParameter) as e:
        SamplingParams(seed=seed)
    assert e.value.param == "seed"
    SamplingParams(seed=2**63 - 1)
    SamplingParams(seed=-(2**63))


def test_unknown_request_fields_are_named_in_the_log_not_dropped_silently(caplog):
    import logging

    from anycore.server.protocol import ChatCompletionRequest, CompletionRequest

    with caplog.at_level(logging.WARNING, logger="anycore.server"):
        ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], guided_decoding_backend="x",
                              temprature=0.5).log_unknown_fields("/v1/chat/completions")
        CompletionRequest(prompt="x").log_unknown_fields("/v1/completions")  # nothing unknown: no line
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["/v1/chat/completions: request fields not known to this server, ignored: "
                     "guided_decoding_backend, temprature"]
