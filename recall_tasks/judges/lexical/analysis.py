"""The lexical judge's analysis of one text: content terms and their alternative forms, numbers, clauses
and their negation, names and acronym definitions (``key_terms``, ``extract_numbers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from recall_tasks.judges.lexical.lexicon import (
    _CANONICAL,
    _PERCENT_PAIRS,
    _PERCENT_WORDS,
    _SCALE_WORDS,
    _STOP,
    _UNITS,
    _WORD_SMALL,
    _WORD_TENS,
    _WORD_UNITS,
)
from recall_tasks.judges.lexical.stemmer import stem
from recall_tasks.judges.lexical.tokens import (
    _AFTER_DIGIT,
    _ARTICLE,
    _BEFORE_DIGIT,
    _C,
    _CJK_NEG_CHARS,
    _CJK_NEG_EXCEPTIONS,
    _CJK_STOP,
    _CLAUSE,
    _I,
    _IN_PARENS,
    _JA_NEG,
    _K,
    _N,
    _NUMWORD,
    _S,
    _TERM,
    _U,
    _W,
    RawToken,
    _normalize,
    _number_key,
    _scan,
    _word_info,
)


@dataclass(frozen=True, slots=True)
class _Clause:
    terms: frozenset[str]
    negated: bool


@dataclass(frozen=True, slots=True)
class _Analysis:
    terms: tuple[str, ...]  # content terms, unique, in order of first occurrence
    match: frozenset[str]  # terms plus alternative forms a statement's term may be found as
    numbers: tuple[str, ...]  # number keys a statement requires (a lone "one" is not required)
    clauses: tuple[_Clause, ...]
    negated: bool
    proper: frozenset[str]  # terms capitalised inside a sentence, acronyms, identifiers
    acronyms: tuple[tuple[str, frozenset[str]], ...]  # acronym term → terms of its expansion
    surface: dict[str, str]  # term → how it was written (for reasons)


class _Builder:
    """Accumulates the terms of one text."""

    __slots__ = (
        "terms",
        "seen",
        "alts",
        "numbers",
        "clauses",
        "clause",
        "clause_neg",
        "negated",
        "proper",
        "surface",
        "acronyms",
    )

    def __init__(self) -> None:
        self.terms: list[str] = []
        self.seen: set[str] = set()
        self.alts: set[str] = set()
        self.numbers: list[str] = []
        self.clauses: list[_Clause] = []
        self.clause: set[str] = set()
        self.clause_neg = False
        self.negated = False
        self.proper: set[str] = set()
        self.surface: dict[str, str] = {}
        self.acronyms: list[tuple[str, frozenset[str]]] = []

    def add(self, term: str, surface: str) -> None:
        self.clause.add(term)
        if term not in self.seen:
            self.seen.add(term)
            self.terms.append(term)
            self.surface[term] = surface

    def alt(self, term: str) -> None:
        self.alts.add(term)
        self.clause.add(term)

    def negate(self) -> None:
        self.clause_neg = True
        self.negated = True

    def close_clause(self) -> None:
        if self.clause or self.clause_neg:
            self.clauses.append(_Clause(frozenset(self.clause), self.clause_neg))
            self.clause.clear()  # cleared in place: _analyze holds a reference
        self.clause_neg = False

    def build(self) -> _Analysis:
        self.close_clause()
        return _Analysis(
            terms=tuple(self.terms),
            match=frozenset(self.seen | self.alts),
            numbers=tuple(dict.fromkeys(self.numbers)),
            clauses=tuple(self.clauses),
            negated=self.negated,
            proper=frozenset(self.proper),
            acronyms=tuple(self.acronyms),
            surface=self.surface,
        )


@lru_cache(maxsize=8192)
def _analyze(text: str) -> _Analysis:
    raws = _scan(_normalize(text))
    b = _Builder()
    seen, clause, surface, proper = b.seen, b.clause, b.surface, b.proper
    add_term = b.terms.append
    recent: list[tuple[str, str | None]] = []  # words of the current sentence, for acronym expansion
    initial = True  # at the start of a sentence (capitalisation says nothing there)
    n = len(raws)
    i = 0
    while i < n:
        kind, raw, flags, value = raws[i]
        i += 1
        if kind == _W:
            role, term, lw, negates = _word_info(raw)
            if negates and not (lw == "not" and _next_word(raws, i) == "only"):  # not only ... but also
                b.negate()
            if role == _TERM:
                clause.add(term)
                if term not in seen:
                    seen.add(term)
                    add_term(term)
                    surface[term] = lw
                if raw[0].isupper() and (not initial or (len(raw) > 1 and raw.isupper())):
                    proper.add(term)
                    if flags & _IN_PARENS and len(raw) > 1 and raw.isupper():
                        _maybe_acronym(term, raw, recent, b)
                recent.append((lw, term))
            elif role == _NUMWORD or (role == _ARTICLE and _next_is_scale(raws, i - 1)):
                i = _read_number(raws, i - 1, b)
            elif role == _CLAUSE:
                b.close_clause()
            else:
                recent.append((lw, None))
            initial = False
        elif kind == _S:
            b.close_clause()
            recent = []
            initial = True
        elif kind == _K:
            b.close_clause()
        elif kind == _N:
            i = _read_number(raws, i - 1, b)
            initial = False
        elif kind == _C:
            _cjk_terms(raw, bool(flags & _AFTER_DIGIT), bool(flags & _BEFORE_DIGIT), b)
            initial = False
        elif kind == _U:
            unit_term = stem(_CANONICAL.get(raw.casefold(), raw.casefold()))
            if value < 0:
                b.alt(unit_term)  # "$" reads as "dollar" but is never required
            else:
                b.add(unit_term, raw)
        elif kind == _I:
            term = raw.casefold()
            b.add(term, term)
            proper.add(term)
            if flags & _IN_PARENS and raw.upper() == raw:
                _maybe_acronym(term, raw, recent, b)
            recent.append((term, term))
            initial = False
        else:  # _H: hyphenated word
            _hyphenated(raw, initial, recent, b)
            initial = False
    return b.build()


def _hyphenated(raw: str, initial: bool, recent: list[tuple[str, str | None]], b: _Builder) -> None:
    """``two-factor`` → ``factor`` (a number word inside a compound is no quantity); also ``twofactor``."""
    parts_terms: list[str] = []
    for k, part in enumerate(raw.split("-")):
        role, term, lw, negates = _word_info(part)
        if role != _TERM:
            recent.append((lw, None))
            continue
        recent.append((lw, term))
        parts_terms.append(term)
        b.add(term, lw)
        if part[0].isupper() and (k > 0 or not initial):
            b.proper.add(term)
    role, joined, _lw, _neg = _word_info(raw.replace("-", ""))
    if role == _TERM and joined not in parts_terms:
        b.alt(joined)


def _cjk_terms(run: str, after_digit: bool, before_digit: bool, b: _Builder) -> None:
    """Character bigrams of a CJK run, cut at particles; a lone character counts as a unigram."""
    for i, ch in enumerate(run):
        if (
            ch in _CJK_NEG_CHARS
            and run[i : i + 2] not in _CJK_NEG_EXCEPTIONS
            and (i == 0 or run[i - 1 : i + 1] not in _CJK_NEG_EXCEPTIONS)
        ):
            b.negate()
            break
    else:
        if any(neg in run for neg in _JA_NEG):
            b.negate()
    segments: list[str] = []
    current: list[str] = []
    last = len(run) - 2
    for i, ch in enumerate(run):
        if ch in _CJK_STOP:
            if current:
                segments.append("".join(current))
                current = []
            continue
        current.append(ch)
        # a measure word right after a number (1879年) or a prefix right before one (第3) stands alone
        if (after_digit and i == 0) or (before_digit and i == last):
            segments.append("".join(current))
            current = []
    if current:
        segments.append("".join(current))
    for seg in segments:
        if len(seg) == 1:
            b.add(seg, seg)
        else:
            for k in range(len(seg) - 1):
                b.add(seg[k : k + 2], seg[k : k + 2])


def _maybe_acronym(term: str, raw: str, recent: list[tuple[str, str | None]], b: _Builder) -> None:
    """Record ``term`` as an acronym if the words before it spell it: ``two-factor authentication (2FA)``."""
    letters = raw.casefold()
    n = len(letters)
    content = [r for r in recent if r[0] not in _STOP]
    for window in (recent[-n:], content[-n:]):
        if len(window) != n:
            continue
        for ch, (word, _term) in zip(letters, window, strict=True):
            if ch.isdigit():
                if _WORD_SMALL.get(word) != int(ch) and word != ch:
                    break
            elif not word.startswith(ch):
                break
        else:
            expansion = frozenset(t for _w, t in window if t)
            if expansion:
                b.acronyms.append((term, expansion))
            return


def _next_word(raws: list[RawToken], i: int) -> str:
    return raws[i][1].casefold() if i < len(raws) and raws[i][0] == _W else ""


def _next_is_scale(raws: list[RawToken], i: int) -> bool:
    return i + 1 < len(raws) and raws[i + 1][0] == _W and raws[i + 1][1].casefold() in _SCALE_WORDS


def _read_number(raws: list[RawToken], i: int, b: _Builder) -> int:
    """Read a number starting at ``raws[i]`` (numeral or number words), record it, return the next index."""
    n = len(raws)
    words: list[str] = []
    kind, raw, _flags, value = raws[i]
    if kind == _N:
        surface = raw
        j = i + 1
    else:
        total = 0.0
        current = 0.0
        last = ""
        j = i
        while j < n and raws[j][0] == _W:
            lw = raws[j][1].casefold()
            if lw in _WORD_UNITS and last not in ("unit", "teen"):
                current += _WORD_UNITS[lw]
                last = "unit" if _WORD_UNITS[lw] < 10 else "teen"
            elif lw in _WORD_TENS and last in ("", "hundred", "scale"):
                current += _WORD_TENS[lw]
                last = "tens"
            elif lw == "hundred" and last in ("", "unit", "teen", "tens", "a"):
                current = max(current, 1.0) * 100
                last = "hundred"
            elif lw in _SCALE_WORDS and lw != "hundred" and last:
                total += max(current, 1.0) * _SCALE_WORDS[lw]
                current = 0.0
                last = "scale"
            elif lw in ("a", "an") and j == i:
                current = 1.0
                last = "a"
            elif (
                lw == "and"
                and last in ("hundred", "scale")
                and j + 1 < n
                and raws[j + 1][0] == _W
                and raws[j + 1][1].casefold() in _WORD_SMALL
            ):
                pass
            else:
                break
            words.append(raws[j][1])
            j += 1
        value = total + current
        surface = " ".join(words)
    # scale and percent words after the number: "1.5 million", "12 per cent"
    while j < n and raws[j][0] == _W:
        lw = raws[j][1].casefold()
        if kind == _N and lw in _SCALE_WORDS:
            value *= _SCALE_WORDS[lw]
        elif lw in _PERCENT_WORDS:
            pass
        elif j + 1 < n and raws[j + 1][0] == _W and (lw, raws[j + 1][1].casefold()) in _PERCENT_PAIRS:
            surface += " " + raws[j][1]
            j += 1
        else:
            break
        surface += " " + raws[j][1]
        j += 1
    key = _number_key(value)
    if kind == _W and len(words) == 1 and words[0].casefold() == "one":
        b.alt(key)  # "one of the founders" is rarely a quantity: matchable, never required
    else:
        b.add(key, surface)
        b.numbers.append(key)
    if j < n and raws[j][0] == _W and raws[j][1].casefold() in _UNITS:  # 300 m, 5 kg, 9 pm
        unit = raws[j][1].casefold()
        b.add(stem(_CANONICAL.get(unit, unit)), raws[j][1])
        j += 1
    return j


def key_terms(text: str) -> list[str]:
    """The content terms the judge matches for ``text`` (stems, CJK bigrams, ``#<number>`` keys)."""
    return list(_analyze(text).terms)


def extract_numbers(text: str) -> list[float]:
    """The numbers of ``text`` as floats: ``"1.5 million and 12%"`` → ``[1500000.0, 12.0]``."""
    return [float(k[1:]) for k in _analyze(text).numbers]
