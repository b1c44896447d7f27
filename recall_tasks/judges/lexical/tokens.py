"""The lexical judge's normalisation and scanning: Unicode normalisation, the two-pass scanner into raw
tokens (words, numbers, CJK runs, punctuation, identifiers, units), numerals, and what each word is.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from functools import lru_cache
from typing import Final

from recall_tasks.judges.lexical.lexicon import (
    _ATTACHED_SCALES,
    _CANONICAL,
    _CJK_SCALES,
    _CLAUSE_WORDS,
    _CURRENCY,
    _NEGATIONS,
    _ORDINAL_SUFFIXES,
    _SCALE_WORDS,
    _STOP,
    _UNITS,
    _WORD_SMALL,
)
from recall_tasks.judges.lexical.stemmer import stem

_CJK_CLASS: Final = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_LETTER: Final = rf"[^\W\d_{_CJK_CLASS}]"
# First pass: cheap tokens (words with inner hyphens/apostrophes, numbers with separators, dotted acronyms,
# parentheses kept for acronym definitions) and sentence/clause punctuation.
_FAST_RE: Final = re.compile(
    r"[^\W_]+(?:(?:['’\-]|[.,](?=\d)|\.(?=[A-Za-z]\.))[^\W_]+)*%?\)?"
    r"|[.!?]+(?=[\s\"'”’)\]]|$)|[。！？;:；：\n($€£¥₹]"
)
# Second pass, only for tokens with digits or CJK characters: split them into their parts.
_DETAIL_RE: Final = re.compile(
    rf"(?P<ident>{_LETTER}++(?:\d+{_LETTER}*)+)"  # letters then digits: COVID19, A4, B2B
    rf"|(?P<word>{_LETTER}++(?:['’]{_LETTER}+)*(?:-{_LETTER}+(?:['’]{_LETTER}+)*)*)"
    rf"|(?P<num>\d+(?:[.,]\d+)*)(?P<suf>{_LETTER}+|[百千万萬亿億])?(?P<pct>%)?"
    rf"|(?P<cjk>[{_CJK_CLASS}]+)"
)
_CJK_RE: Final = re.compile(f"[{_CJK_CLASS}]")
_COMBINING_RE: Final = re.compile("[\u0300-\u036f]")
_SENTENCE_PUNCT: Final = frozenset(".!?。！？\n")
_CLAUSE_PUNCT: Final = frozenset(";:；：")

_ZH_STOP: Final = "的了是在和与與及也都被把这這那之于於着著並并且其他她它我你们們"
_JA_STOP: Final = "・はがをにでのともへや"
_CJK_STOP: Final = frozenset(_ZH_STOP + _JA_STOP)
_CJK_NEG_CHARS: Final = frozenset("不没沒无無未非")
# compounds with a negation character that do not negate: very, future, not only, but, continuously,
# regardless, different, many
_CJK_NEG_EXCEPTIONS: Final = frozenset(
    "非常 未来 未來 不仅 不僅 不过 不過 不断 不斷 无论 無論 不论 不論 不同 不少".split()
)
_JA_NEG: Final = ("ない", "ません", "なかった")
_ELISIONS: Final = frozenset("l d j m n s t c qu jusqu lorsqu puisqu dell all nell sull un".split())

# Raw token kinds of the first pass: word, number, CJK run, sentence end, clause end, hyphenated word,
# identifier (letters and digits: 2FA, COVID19), unit or currency next to a number (5km, $).
_W, _N, _C, _S, _K, _H, _I, _U = range(8)
RawToken = tuple[int, str, int, float]  # kind, text, flags, value
_Append = Callable[[RawToken], None]
_IN_PARENS, _AFTER_DIGIT, _BEFORE_DIGIT = 1, 2, 4

# What a word is, decided once per distinct word (cached): content term, or one of these roles.
_TERM, _SKIP, _NEG, _CLAUSE, _NUMWORD, _ARTICLE = range(6)


def _normalize(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    if not text.isascii():
        text = unicodedata.normalize("NFC", _COMBINING_RE.sub("", unicodedata.normalize("NFD", text)))
    return text


def _parse_numeral(s: str) -> float | None:
    """``1,500,000`` → 1500000; ``3.14`` → 3.14; ``1,5`` → 1.5; ``1.500.000`` → 1500000; ``3.11.2`` → None."""
    if "," in s and "." in s:
        s = s.replace(".", "").replace(",", ".") if s.rfind(",") > s.rfind(".") else s.replace(",", "")
    elif "," in s:
        groups = s.split(",")
        if all(len(g) == 3 for g in groups[1:]):
            s = s.replace(",", "")
        elif len(groups) == 2:
            s = s.replace(",", ".")
        else:
            return None
    elif s.count(".") > 1:
        groups = s.split(".")
        if not all(len(g) == 3 for g in groups[1:]):
            return None
        s = s.replace(".", "")
    try:
        return float(s)
    except ValueError:
        return None


def _version_value(s: str) -> float | None:
    """A dotted version whose trailing parts are zeros reads as the shorter version: ``3.12.0`` → 3.12.

    ``3.12.0`` and ``3.12`` name one release; ``3.12.1`` (a different release) stays ``None``, an identifier.
    """
    parts = s.split(".")
    if len(parts) < 3 or not all(p.isdigit() for p in parts):
        return None
    while len(parts) > 2 and set(parts[-1]) == {"0"}:
        parts.pop()
    return float(".".join(parts)) if len(parts) == 2 else None


def _number_key(value: float) -> str:
    return f"#{value:.12g}"


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return 0x3040 <= o <= 0x30FF or 0x3400 <= o <= 0x9FFF or 0xF900 <= o <= 0xFAFF or 0xAC00 <= o <= 0xD7AF


@lru_cache(maxsize=65536)
def _word_info(word: str) -> tuple[int, str, str, bool]:
    """``(role, term, casefolded word, negates)`` of one word as written; cached per distinct word."""
    lw = word.casefold()
    negates = False
    if "'" in lw or "’" in lw:
        lw = lw.replace("’", "'")
        if lw.endswith("n't"):
            return _SKIP, "", lw, True
        head, _, tail = lw.partition("'")
        if tail in ("s", "re", "ve", "ll", "d", "m", "t"):
            lw = head
        elif head in _ELISIONS:
            negates = head == "n"
            lw = tail
        else:
            lw = lw.replace("'", "")
    if lw in _NEGATIONS:
        return _NEG, "", lw, True
    if lw in _CLAUSE_WORDS:
        return _CLAUSE, "", lw, negates
    if lw in _WORD_SMALL:
        return _NUMWORD, "", lw, negates
    if lw in ("a", "an"):
        return _ARTICLE, "", lw, negates
    if (lw in _STOP and not (len(word) > 1 and word.isupper())) or (len(lw) == 1 and lw.isascii()):
        return _SKIP, "", lw, negates  # an acronym that looks like a stop word (US, IT, WHO) is kept
    return _TERM, stem(_CANONICAL.get(lw, lw)), lw, negates


def _scan(text: str) -> list[RawToken]:
    raws: list[RawToken] = []
    append = raws.append
    opened = False  # the previous token was "("
    currency: str | None = None  # the previous token was a currency sign
    for tok in _FAST_RE.findall(text):
        if tok.isalpha():
            if tok.isascii() or not _CJK_RE.search(tok):
                append((_W, tok, 0, 0.0))
            else:
                _scan_detail(tok, 0, None, append)
            opened = False
            currency = None
            continue
        first = tok[0]
        if first in _SENTENCE_PUNCT:
            append((_S, "", 0, 0.0))
        elif first in _CLAUSE_PUNCT:
            append((_K, "", 0, 0.0))
        elif first == "(":
            opened = True
            continue
        elif first in _CURRENCY:
            currency = _CURRENCY[first]
            continue
        else:
            flags = 0
            if tok.endswith(")"):
                tok = tok[:-1]
                flags = _IN_PARENS if opened else 0
            if "." in tok and tok[1:2] == "." and tok.replace(".", "").isalpha():  # U.S → US
                append((_W, tok.replace(".", ""), flags, 0.0))
            elif tok.isalpha():
                append((_W, tok, flags, 0.0))
            elif any(ch.isdigit() for ch in tok) or _CJK_RE.search(tok):
                _scan_detail(tok, flags, currency, append)
            elif "-" in tok:
                _scan_hyphenated(tok, flags, append)
            else:  # apostrophes
                append((_W, tok, flags, 0.0))
        opened = False
        currency = None
    return raws


def _scan_hyphenated(word: str, flags: int, append: _Append) -> None:
    parts = [p for p in word.split("-") if p]
    if all(p.casefold() in _WORD_SMALL or p.casefold() in _SCALE_WORDS for p in parts):
        for p in parts:  # twenty-five
            append((_W, p, flags, 0.0))
    else:
        append((_H, word, flags, 0.0))


def _scan_detail(tok: str, flags: int, currency: str | None, append: _Append) -> None:
    """Split a token holding digits or CJK characters: ``1879年出生``, ``COVID-19``, ``2bn``, ``2FA``."""
    for m in _DETAIL_RE.finditer(tok):
        kind = m.lastgroup
        if kind == "word":
            word = m.group()
            if "-" in word:
                _scan_hyphenated(word, flags, append)
            else:
                append((_W, word, flags, 0.0))
        elif kind == "ident":
            append((_I, m.group(), flags, 0.0))
        elif kind == "cjk":
            cjk_flags = 0
            if m.start() > 0 and tok[m.start() - 1].isdigit():
                cjk_flags |= _AFTER_DIGIT
            if m.end() < len(tok) and tok[m.end()].isdigit():
                cjk_flags |= _BEFORE_DIGIT
            append((_C, m.group(), cjk_flags, 0.0))
        else:
            _scan_number(m, flags, currency if m.start() == 0 else None, append)


def _scan_number(m: re.Match[str], flags: int, currency: str | None, append: _Append) -> None:
    num = m.group("num")
    suffix = m.group("suf")
    value = _parse_numeral(num)
    if value is None:
        value = _version_value(num)
    if value is None:  # a version string such as 3.11.2
        append((_I, num + (suffix or ""), flags, 0.0))
        return
    unit = None
    if suffix:
        lsuf = suffix.casefold()
        if suffix in _CJK_SCALES:
            value *= _CJK_SCALES[suffix]
        elif lsuf in _ATTACHED_SCALES:
            value *= _ATTACHED_SCALES[lsuf]
        elif lsuf == "m" and (suffix == "M" or currency):
            value *= 1e6
        elif lsuf == "b" and (suffix == "B" or currency):
            value *= 1e9
        elif lsuf in _ORDINAL_SUFFIXES:
            pass
        elif lsuf in _UNITS:
            unit = suffix
        else:  # 2FA, 3D
            append((_I, num + suffix, flags, 0.0))
            return
    if currency:
        append((_U, currency, 0, -1.0))
    append((_N, m.group().strip() if unit is None else num, 0, value))
    if unit is not None:
        append((_U, unit, 0, 0.0))
