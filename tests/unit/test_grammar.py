"""engine/grammar.py over a tiny in-memory word-level vocabulary (no model): specs, compiling,
the LRU, matchers and the packed bitmask."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("xgrammar")

from anycore.engine.grammar import (  # noqa: E402
    GrammarCompiler,
    GrammarMatcher,
    StructuredOutput,
    allowed_tokens,
    banned_tokens,
)
from anycore.errors import InvalidParameter  # noqa: E402

WORDS = ["<eos>", "a", "b", "c", "1", "2", "{", "}", '"', ":", "x", "y"]
VOCAB = 40  # wider than the tokenizer's 12 words, as a padded logits head is


class WordTokenizer:
    def __init__(self) -> None:
        from tokenizers import Tokenizer
        from tokenizers.models import WordLevel

        self.backend_tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<eos>"))


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler(WordTokenizer(), VOCAB, [0], cache_size=2)


def allowed(m: GrammarMatcher) -> list[int]:
    bm = torch.zeros((1, 2), dtype=torch.int32)
    m.fill_bitmask(bm, 0)
    return allowed_tokens(bm, VOCAB)[0].nonzero().flatten().tolist()


def test_regex_masks_then_reaches_its_end(compiler):
    m = GrammarMatcher(compiler.compile(StructuredOutput("regex", "a[12]")), VOCAB, [0])
    assert allowed(m) == [1]
    assert m.accept(1) and not m.at_end
    assert allowed(m) == [4, 5]
    assert not m.accept(3)  # not in the grammar
    assert m.accept(5) and m.at_end  # nothing but the stop token may follow


def test_choice_ends_after_a_whole_choice(compiler):
    m = GrammarMatcher(compiler.compile(StructuredOutput("choice", ["ab", "c"])), VOCAB, [0])
    assert allowed(m) == [1, 3]
    assert m.accept(1) and not m.at_end
    assert m.accept(2) and m.at_end


def test_ids_past_the_tokenizer_vocabulary_are_never_allowed(compiler):
    m = GrammarMatcher(compiler.compile(StructuredOutput("regex", "[a-z12{}\":]+")), VOCAB, [0])
    assert max(allowed(m)) < len(WORDS)


def test_compiled_grammars_are_cached_by_spec(compiler):
    first = compiler.compile(StructuredOutput("regex", "b+"))
    hits = compiler.hits
    again = StructuredOutput("regex", "b+")
    assert compiler.compile(again) is first and compiler.hits == hits + 1
    assert again.compiled is first  # shared by every sample of a request
    compiler.compile(StructuredOutput("regex", "c+"))
    compiler.compile(StructuredOutput("regex", "x+"))  # cache_size 2: "b+" is evicted
    misses = compiler.misses
    compiler.compile(StructuredOutput("regex", "b+"))
    assert compiler.misses == misses + 1


@pytest.mark.parametrize(("kind", "spec"), [("regex", "(a"), ("ebnf", "root ::= undefined_rule"),
                                            ("json_schema", {"type": "no-such-type"})])
def test_a_spec_that_does_not_compile_names_its_field(compiler, kind, spec):
    with pytest.raises(InvalidParameter, match="does not compile") as e:
        compiler.compile(StructuredOutput(kind, spec, param="guided_x"))
    assert e.value.param == "guided_x"
    assert "/project/" not in e.value.message  # xgrammar's source location is dropped


@pytest.mark.parametrize(("kind", "spec"), [("choice", []), ("choice", ["a", ""]), ("regex", ""),
                                            ("json_schema", "{not json"), ("json_schema", [1]), ("yaml", "x")])
def test_malformed_specs_are_rejected_before_compiling(kind, spec):
    with pytest.raises(InvalidParameter) as e:
        StructuredOutput(kind, spec, param="response_format")
    assert e.value.param == "response_format"


def test_json_schema_text_and_object_share_a_cache_key():
    a = StructuredOutput("json_schema", '{"type": "object", "required": ["a"]}')
    b = StructuredOutput("json_schema", {"required": ["a"], "type": "object"})
    assert a.key == b.key


def test_allowed_tokens_unpacks_bits_and_pads_wider_logits():
    bm = torch.tensor([[0b101, 0], [-1, -1]], dtype=torch.int32)
    mask = allowed_tokens(bm, 70)  # 64 bits packed, 70 logits: the last 6 columns are off
    assert mask.shape == (2, 70)
    assert mask[0].nonzero().flatten().tolist() == [0, 2]
    assert mask[1, :64].all() and not mask[1, 64:].any()
    assert allowed_tokens(bm, 40).shape == (2, 40)


def test_banned_tokens_is_the_complement_and_bans_the_padding():
    bm = torch.tensor([[0b101, -1]], dtype=torch.int32)
    banned = banned_tokens(bm, 70)
    assert torch.equal(banned[:, :64], ~allowed_tokens(bm, 64)) and banned[0, 64:].all()


def test_a_spec_compiled_for_another_vocabulary_is_compiled_again(compiler):
    so = StructuredOutput("regex", "a+")
    first = compiler.compile(so)
    other = GrammarCompiler(WordTokenizer(), VOCAB, [0])
    assert other.compile(so) is not first and so.compiled_by is other
