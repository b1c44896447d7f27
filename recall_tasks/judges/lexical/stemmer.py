"""The lexical judge's stemmer: ``stem``, snowballstemmer's English (Porter2) stemmer after a table of irregular forms.

Porter2 from the Snowball project (the ``snowballstemmer`` package) replaced a hand-written Porter-like stemmer:
on the judge's tuning set both agree with the human labels on the same 142 of 170 statements, the same 28
disagreements (``python benchmarks/lexical_accuracy.py --stemmer snowball`` measured it, on the tuning set only:
deciding on the held-out set would have tuned the judge on it). Changing the stemmer changes verdicts, so it is
part of the judge's ``PROMPT_VERSION`` (``lexical-v3``).
"""

from __future__ import annotations

from functools import lru_cache

import snowballstemmer

from recall_tasks.judges.lexical.lexicon import _IRREGULAR

_ENGLISH = snowballstemmer.stemmer("english")


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """Porter2 stem of a lowercase ASCII word; other words (and words of 1-2 letters) are returned unchanged.

    ``encrypted``/``encryption``/``encrypts`` → ``encrypt``; ``developed``/``development`` → ``develop``;
    irregular forms (``won`` → ``win``, ``children`` → ``child``) come from a small table first.
    """
    if len(word) <= 2 or not word.isascii() or not word.isalpha():
        return word
    return str(_ENGLISH.stemWord(_IRREGULAR.get(word, word)))
