"""TextTokenizer agrees with transformers' tokenizer on the same files, token for token."""

from __future__ import annotations

import copy
import json

import jinja2
import pytest

from anycore.loader.text_tokenizer import TextTokenizer

TEXTS = [
    "Hello, world!",
    "  leading and trailing spaces  ",
    "Tabs\tand\nnewlines\n\n and   runs of spaces",
    "Unicode: café, naïve, 日本語, emoji 🦙🚀, Ελληνικά",
    "Code: def f(x):\n    return x ** 2  # comment",
    "Numbers 1234567890 3.14159 -42",
    "Special tokens in text: <|im_start|>user\nhi<|im_end|>",
    "",
]

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Count to 3, café 🦙"}],
]


@pytest.fixture(scope="module")
def pair(tokenizer):
    """(anycore's, transformers') tokenizer on the default model's converted files."""
    from transformers import AutoTokenizer

    assert isinstance(tokenizer, TextTokenizer)
    return tokenizer, AutoTokenizer.from_pretrained(str(tokenizer.folder), local_files_only=True)


def test_encode_matches_transformers(pair):
    ours, hf = pair
    for text in TEXTS:
        for special in (True, False):
            assert ours.encode(text, add_special_tokens=special) == hf.encode(text, add_special_tokens=special), text


def test_decode_matches_transformers(pair):
    ours, hf = pair
    for text in TEXTS:
        ids = hf.encode(text)
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text
    first = hf.encode(TEXTS[0])[0]
    assert ours.decode(first) == hf.decode(first)
    some = [0, 1, 2, 5, 100, 1000, 30000, len(hf) - 1]
    assert ours.decode(some) == hf.decode(some)


def test_chat_template_and_special_tokens_match_transformers(pair):
    ours, hf = pair
    assert ours.chat_template == hf.chat_template
    assert (ours.eos_token_id, ours.bos_token_id, ours.pad_token_id) == (hf.eos_token_id, hf.bos_token_id,
                                                                         hf.pad_token_id)
    assert len(ours) == len(hf)
    for chat in CHATS:
        for gen in (True, False):
            want = hf.apply_chat_template(chat, add_generation_prompt=gen, tokenize=True)
            want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "input_ids") else want
            assert ours.apply_chat_template(chat, add_generation_prompt=gen) == list(want)
            assert ours.apply_chat_template(chat, add_generation_prompt=gen, tokenize=False) == \
                hf.apply_chat_template(chat, add_generation_prompt=gen, tokenize=False)


def test_save_pretrained_round_trips_and_copies_are_independent(pair, tmp_path):
    ours, hf = pair
    ours.save_pretrained(tmp_path / "tok")
    again = TextTokenizer(tmp_path / "tok")
    twin = copy.deepcopy(ours)  # the server gives its front end its own copy
    for text in TEXTS:
        assert again.encode(text) == ours.encode(text) == twin.encode(text)
    assert again.apply_chat_template(CHATS[1]) == ours.apply_chat_template(CHATS[1])


def _with_template(folder, tmp_path, template):
    out = tmp_path / "t"
    TextTokenizer(folder).save_pretrained(out)
    (out / "chat_template.jinja").write_text(template)
    return TextTokenizer(out)


def test_templates_run_sandboxed_with_transformers_helpers(pair, tmp_path):
    ours, _ = pair
    tok = _with_template(ours.folder, tmp_path, "{% for m in messages %}{{ m | tojson }}{% generation %}"
                         "[{{ m.role }}]{% endgeneration %}{% if loop.index > 0 %}{% break %}{% endif %}"
                         "{% endfor %}{{ eos_token }}")
    text = tok.apply_chat_template([{"role": "user", "content": "<b>é</b>", "name": None}] * 2, tokenize=False)
    assert text == json.dumps({"role": "user", "content": "<b>é</b>"}, ensure_ascii=False) + "[user]<|im_end|>"
    bad = _with_template(ours.folder, tmp_path, "{{ raise_exception('no system role') }}")
    with pytest.raises(jinja2.exceptions.TemplateError, match="no system role"):
        bad.apply_chat_template(CHATS[0])
    escape = _with_template(ours.folder, tmp_path, "{{ messages.__class__.__mro__ }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        escape.apply_chat_template(CHATS[0])


@pytest.mark.parametrize("flags", [{"add_bos_token": True}, {"add_bos_token": True, "add_eos_token": True},
                                   {"add_bos_token": False}])
def test_add_bos_eos_flags_in_the_config_match_transformers(pair, tmp_path, flags):
    from transformers import AutoTokenizer

    ours, _ = pair
    out = tmp_path / "t"
    ours.save_pretrained(out)
    config = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**config, **flags}))
    mine, hf = TextTokenizer(out), AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    for text in TEXTS:
        assert mine.encode(text) == hf.encode(text), (flags, text)
        assert mine.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
