"""Incremental detokenization: equals a full decode, never splits characters, honours stop strings."""

from __future__ import annotations

from anycore.engine.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello, world! This is a test of incremental decoding.",
    "Unicode: café, naïve, 日本語のテキスト, emoji 🚀🔥 and math ∑∫.",
    "def f(x):\n    return x * 2  # tabs\tand spaces",
]


def stream(tok, text, stop=(), include=False, prompt="Prompt:"):
    ids = tok.encode(text)
    d = IncrementalDetokenizer(tok, tok.encode(prompt), list(stop), True, include)
    chunks = []
    for i, t in enumerate(ids):
        d.add([t])
        chunks.append(d.delta(final=d.stopped or i == len(ids) - 1))
        if d.stopped:
            break
    return chunks, d


def test_stream_equals_full_decode(tokenizer):
    for text in TEXTS:
        chunks, d = stream(tokenizer, text)
        assert "".join(chunks) == tokenizer.decode(tokenizer.encode(text)) == d.text
        assert all("\ufffd" not in c for c in chunks)  # multi-byte characters never split


def test_stop_string_truncates_and_stops(tokenizer):
    chunks, d = stream(tokenizer, "one two three four five", stop=["three"])
    assert d.stopped and d.text == "one two "
    assert "".join(chunks) == "one two "


def test_stop_string_included_when_asked(tokenizer):
    _, d = stream(tokenizer, "one two three four", stop=["three"], include=True)
    assert d.text == "one two three"


def test_partial_stop_string_is_held_back_then_released(tokenizer):
    chunks, d = stream(tokenizer, "alpha beta gamma", stop=["beta delta"])
    assert not d.stopped
    assert "".join(chunks) == "alpha beta gamma"
    # while "beta" could start the stop string it was not yet emitted
    assert not any(c.endswith(" beta") for c in chunks[:-1])
