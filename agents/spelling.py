"""Slips in a question's topic words ("latnecy", "fialed", "cahce"), put right before the
cues read it.

A word is corrected only when it is no English word (pyspellchecker's English frequency list),
no part of a known model's name, and exactly one word of the readers' own vocabulary (the cues'
words and the labelled examples' words) is a slip away: one edit (a transposition counts as
one) for words of five letters or more, two for words of seven or more. Real words are never
changed ("show" is not "slow"), and a word two vocabulary words are equally near stays as it
is: a guess there would be a rule for one typo.

Where the thresholds came from: five letters and one edit, as the model-name check
(``agents.intent._misspelt``); two edits from seven letters, since a slip in a short word
reaches too many words. Chosen before the held-out question sets were read; the second set's
misses (docs/benchmarks.md) showed the class, not these values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

from nltk.metrics.distance import edit_distance
from spellchecker import SpellChecker

__all__ = ["Speller", "default_speller", "vocabulary_of"]

MIN_LENGTH = 5  # shorter words: a slip lands on too many others
TWO_EDITS_FROM = 7
_WORD = re.compile(r"[A-Za-z]+")
_OPTIONAL_LAST = re.compile(r"([A-Za-z]+)\?")
# A word on its own: not part of an id, a model name or a number ("act-9f2c", "smollm2").
_LONE_WORD = re.compile(r"(?<![A-Za-z0-9_-])[A-Za-z]+(?![A-Za-z0-9_-])")


def vocabulary_of(texts: Iterable[str]) -> set[str]:
    """The lower-case words of four letters or more in ``texts`` (cue patterns' literal words,
    examples): what a slip may be corrected to."""
    words = {w.lower() for t in texts for w in _WORD.findall(t)}
    # A pattern's "percentiles?" knows "percentile" too.
    words |= {m.group(1).lower()[:-1] for t in texts for m in _OPTIONAL_LAST.finditer(t)}
    return {w for w in words if len(w) >= 4}


@lru_cache(maxsize=1)
def _english() -> SpellChecker:
    return SpellChecker()  # the bundled English list: loaded once, ~0.2 s


class Speller:
    """Puts right slips in words that the vocabulary knows."""

    def __init__(self, vocabulary: Iterable[str]) -> None:
        self._vocabulary = frozenset(vocabulary)

    def correction(self, word: str, protected: frozenset[str] = frozenset()) -> str | None:
        """The vocabulary word ``word`` is a slip of, or None."""
        w = word.lower()
        if len(w) < MIN_LENGTH or w in self._vocabulary or w in protected or w in _english():
            return None
        for edits in (1, 2) if len(w) >= TWO_EDITS_FROM else (1,):
            near = [v for v in self._vocabulary if abs(len(v) - len(w)) <= edits
                    and edit_distance(w, v, transpositions=True) <= edits]
            if near:
                return near[0] if len(near) == 1 else None
        return None

    def fix(self, question: str, models: Iterable[str] = ()) -> str:
        """``question`` with its slips put right; model names are left as they are."""
        protected = frozenset(p for m in models for p in _WORD.findall(m.lower()))

        def one(match: re.Match[str]) -> str:
            return self.correction(match.group(0), protected) or match.group(0)

        return _LONE_WORD.sub(one, question)


@lru_cache(maxsize=1)
def default_speller() -> Speller:
    """The speller over the cues' words, the window units and the labelled examples."""
    from agents import cues
    from agents.intent_knn import load_examples

    patterns = [cue.pattern for _, cue in cues.TELEMETRY]
    patterns += [p.pattern for p in (cues.CAUSE, cues.FAILED, cues.NEW, cues.BY_VERSION,
                                      cues.BY_REPLICA)]
    patterns.append("seconds minutes hours")
    examples = [text for texts in load_examples().values() for text in texts]
    return Speller(vocabulary_of(patterns + examples))
