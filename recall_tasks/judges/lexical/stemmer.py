"""The lexical judge's stemmer: ``stem``, a light Porter-like suffix stemmer for English words."""

from __future__ import annotations

from functools import lru_cache
from typing import Final

from recall_tasks.judges.lexical.lexicon import _IRREGULAR

_VOWELS: Final = frozenset("aeiou")
_DERIVATIONAL: Final[tuple[tuple[str, int], ...]] = (
    # (suffix, minimum stem length left), longest first; a final "e" is already gone (-ive → -iv)
    ("ization", 3),
    ("ations", 3),
    ("ation", 3),
    ("ities", 3),
    ("ments", 4),
    ("ment", 4),
    ("ness", 3),
    ("ions", 3),
    ("anc", 3),
    ("enc", 3),
    ("abl", 3),
    ("ibl", 3),
    ("ion", 3),
    ("ity", 3),
    ("ism", 3),
    ("ist", 3),
    ("ful", 3),
    ("iv", 3),
    ("iz", 3),
    ("at", 3),
    ("al", 3),
    ("er", 4),
)


def _has_vowel(s: str) -> bool:
    return any(ch in _VOWELS for ch in s)


def _undouble(s: str) -> str:
    if s.endswith(("at", "bl", "iz")):
        return s + "e"
    if len(s) >= 3 and s[-1] == s[-2] and s[-1] not in "lsz" and s[-1] not in _VOWELS:
        return s[:-1]
    return s


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """Light Porter-like stem of a lowercase ASCII word; other words are returned unchanged.

    ``encrypted``/``encryption``/``encrypts`` → ``encrypt``; ``developed``/``development`` → ``develop``;
    irregular forms (``won`` → ``win``, ``children`` → ``child``) come from a small table.
    """
    if len(word) <= 2 or not word.isascii() or not word.isalpha():
        return word
    w = _IRREGULAR.get(word, word)
    # inflection: plurals, -ed, -ing
    if w.endswith("sses"):
        w = w[:-2]
    elif w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith("s") and len(w) > 3 and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    if w.endswith("ied") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith("eed"):
        if len(w) > 4:
            w = w[:-1]
    elif w.endswith("ed") and len(w) >= 4 and _has_vowel(w[:-2]):
        w = _undouble(w[:-2])
        if len(w) == 2:
            w += "e"  # used → use, aged → age
    elif w.endswith("ing") and len(w) >= 5 and _has_vowel(w[:-3]):
        w = _undouble(w[:-3])
        if len(w) == 2:
            w += "e"
    if w.endswith("ly") and len(w) > 5:
        w = w[:-2]
    if w.endswith("e") and len(w) >= 4:
        w = w[:-1]
    # derivation: up to two suffixes (effectiveness → effectiv → effect)
    derived = False
    for _ in range(2):
        for suffix, min_stem in _DERIVATIONAL:
            if w.endswith(suffix) and len(w) - len(suffix) >= min_stem:
                if suffix.startswith("ion") and w[-len(suffix) - 1] not in "st":
                    continue
                w = w[: -len(suffix)]
                derived = True
                break
        else:
            break
    if derived and w.endswith("e") and len(w) >= 4:
        w = w[:-1]
    if w.endswith("y") and len(w) > 3 and w[-2] not in _VOWELS:
        w = w[:-1] + "i"
    return w
