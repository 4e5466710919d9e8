"""Putting right a slip in a topic word, and nothing else."""

from __future__ import annotations

from agents.spelling import Speller, default_speller, vocabulary_of

MODELS = ["smollm2-135m-instruct", "minilm-l6-v2", "ppocr-v4", "echo"]


def test_a_slip_one_edit_away_from_one_known_word_is_put_right() -> None:
    s = default_speller()
    assert s.fix("p95 latnecy of echo") == "p95 latency of echo"  # a swap is one edit
    assert s.fix("fialed requests") == "failed requests"
    assert s.fix("p99 percentle of echo") == "p99 percentile of echo"  # a dropped letter


def test_english_words_ids_and_model_names_are_left_as_they_are() -> None:
    s = default_speller()
    assert s.fix("show me the slow ones") == "show me the slow ones"  # show is not slow
    assert s.fix("approve act-deadbeefcafe") == "approve act-deadbeefcafe"
    assert s.fix("latency of smollm and minilm", MODELS) == "latency of smollm and minilm"


def test_short_words_and_ties_are_not_guessed() -> None:
    s = Speller(vocabulary_of(["cache", "trace", "track", "logs"]))
    assert s.correction("lgos") is None  # under five letters: too many words are that near
    assert s.correction("tracq") is None  # one edit from two words: no guess
    assert s.correction("cahce") == "cache"


def test_two_edits_only_for_long_words() -> None:
    s = Speller(vocabulary_of(["compare", "queue"]))
    assert s.correction("compair") == "compare"
    assert s.correction("qeuxe") is None  # two edits (a swap, a wrong letter), five letters
