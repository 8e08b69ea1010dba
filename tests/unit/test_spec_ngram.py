"""Prompt-lookup drafts: the continuation of the latest earlier occurrence of the suffix."""

from __future__ import annotations

from anycore.spec.ngram import propose_ngram


def test_longest_suffix_first_then_shorter():
    # suffix "3 4" (n=2) occurs at 2..3 -> 5 6 7; n=3 "2 3 4"... does not occur earlier
    tokens = [9, 9, 3, 4, 5, 6, 7, 8, 1, 3, 4]
    assert propose_ngram(tokens, 3, n_max=3, n_min=1) == [5, 6, 7]
    # "8 3 4" (n=3) only matches where the longer context agrees
    tokens = [8, 3, 4, 1, 2, 9, 3, 4, 5, 6, 8, 3, 4]
    assert propose_ngram(tokens, 2, n_max=3, n_min=1) == [1, 2]


def test_the_latest_match_wins_and_k_caps_the_draft():
    tokens = [1, 2, 10, 11, 1, 2, 20, 21, 22, 1, 2]
    assert propose_ngram(tokens, 2, 2, 2) == [20, 21]
    assert propose_ngram(tokens, 10, 2, 2) == [20, 21, 22, 1, 2]  # runs up to the end of the context


def test_no_match_or_below_the_minimum_gives_nothing():
    assert propose_ngram([1, 2, 3, 4], 4, 3, 1) == []
    assert propose_ngram([1, 2, 3, 1], 4, 3, 2) == []  # only a 1-gram recurs
    assert propose_ngram([1, 2, 3, 1], 4, 3, 1) == [2, 3, 1]
    assert propose_ngram([5], 4, 3, 1) == []
    assert propose_ngram([1, 1, 1], 0, 3, 1) == []
