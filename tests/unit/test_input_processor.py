"""InputProcessor: prompt shapes, validation with typed errors, and the n fan-out (real tokenizer)."""

from __future__ import annotations

import pytest

from anycore.engine.input_processor import InputProcessor
from anycore.errors import ContextLengthExceeded, InvalidParameter, InvalidRequest
from anycore.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def inputs(tokenizer):
    return InputProcessor(tokenizer, vocab_size=49152, max_model_len=32)


def test_prompt_shapes():
    split = InputProcessor.split_prompts
    assert split("hi") == ["hi"]
    assert split([1, 2]) == [[1, 2]]
    assert split(["a", "b"]) == ["a", "b"]
    assert split([[1], [2, 3]]) == [[1], [2, 3]]
    assert split([]) == []


def test_text_and_chat_encode_with_the_tokenizer(inputs, tokenizer):
    assert inputs.encode_prompt("Hello world") == tokenizer.encode("Hello world")
    assert inputs.encode_prompt([5, 6]) == [5, 6]
    chat = [{"role": "user", "content": "hi"}]
    assert inputs.encode_chat(chat) == list(tokenizer.apply_chat_template(chat, add_generation_prompt=True,
                                                                          tokenize=True))
    with pytest.raises(InvalidRequest, match="messages is empty") as e:
        inputs.encode_chat([])
    assert e.value.param == "messages"
    with pytest.raises(InvalidRequest, match="empty") as e:
        inputs.encode_prompt("", param="text")
    assert e.value.param == "text"


def test_fan_out_indices_and_seeds(inputs):
    params = SamplingParams(n=3, seed=10, temperature=0.7, max_tokens=4, stop=["x"])
    out = inputs.process("r", [[1, 2], [3]], params)
    assert [r.request_id for r in out] == [f"r-{k}" for k in range(6)]
    assert [r.index for r in out] == list(range(6))
    assert [r.prompt_token_ids for r in out] == [[1, 2]] * 3 + [[3]] * 3
    assert [r.params.seed for r in out] == [10, 11, 12] * 2
    assert all(r.params.n == 1 and r.params.temperature == 0.7 and r.params.stop == ["x"] for r in out)
    assert len({id(r.params) for r in out}) == 6  # no two engine requests share a params object
    unseeded = inputs.process("u", [[1]], SamplingParams(n=2))
    assert [r.params.seed for r in unseeded] == [None, None]


def test_prompt_validation_is_typed(inputs):
    p = SamplingParams(max_tokens=8)
    with pytest.raises(InvalidRequest, match="empty"):
        inputs.process("r", [], p)
    with pytest.raises(InvalidRequest, match="empty"):
        inputs.process("r", [[]], p, param="messages")
    with pytest.raises(InvalidRequest, match=r"token ids must be integers in \[0, 49152\)") as e:
        inputs.process("r", [[1, 49152]], p, param="input_ids")
    assert e.value.param == "input_ids" and e.value.status == 400
    with pytest.raises(ContextLengthExceeded) as e:
        inputs.process("r", [[1] * 32], p)
    assert e.value.code == "context_length_exceeded" and e.value.param == "prompt"
    assert isinstance(e.value, ValueError)  # offline callers catch ValueError


def test_completion_must_fit_only_when_asked(inputs):
    p = SamplingParams(max_tokens=8)
    prompt = [1] * 30  # 30 + 8 > 32
    assert len(inputs.process("r", [prompt], p)) == 1  # offline: ends early with finish reason 'length'
    with pytest.raises(ContextLengthExceeded, match="38 tokens"):
        inputs.process("r", [prompt], p, completion_must_fit=True)
    assert inputs.process("r", [[1] * 24], p, completion_must_fit=True)  # 24 + 8 == 32 fits


def test_parameters_are_checked_again_at_processing(inputs):
    with pytest.raises(InvalidParameter) as e:
        SamplingParams(top_p=0)
    assert e.value.param == "top_p" and e.value.code == "invalid_value"
    p = SamplingParams()
    p.temperature = -1.0  # changed after construction
    with pytest.raises(InvalidParameter, match="temperature"):
        inputs.process("r", [[1]], p)
