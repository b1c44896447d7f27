"""The offline lexical judge: deterministic, no API key, no network, no model files.

``LexicalJudge`` decides statements by weighted overlap of normalised *key terms*. It is the judge of
demos and CI, and a cheap baseline; it is not a substitute for an LLM judge on real evaluations.

What it does
    * Normalises text: Unicode NFKC, casefold, accents stripped for matching (``Málaga`` = ``Malaga``),
      dotted acronyms joined (``U.S.`` = ``US``), punctuation dropped, a compact stop list removed
      (English plus the commonest Spanish/French/German function words, and pronouns, which the
      question may resolve, so they never count as missing).
    * Stems Latin-script words with a light Porter-like suffix stemmer and a small table of irregular
      forms (``encrypted``/``encryption``, ``developed``/``development``, ``won``/``win``).
    * Splits Chinese, Japanese and Korean runs into character bigrams (no spaces to split on), cut at
      particles such as 的/是/は/が; other scripts (Cyrillic, Greek, Arabic...) are kept as whole words.
    * Compares numbers as numbers: ``1,500,000`` = ``1.5 million`` = ``1.5M`` = ``1500000``,
      ``12%`` = ``12 percent`` = ``twelve per cent``, ``3k`` = ``3000``, ``150万`` = ``1.5 million``;
      ``1879`` != ``1897``. In contextual recall a statement number missing from the supporting evidence
      makes the statement unsupported ("number mismatch"); extra numbers in the evidence are fine.
    * Detects negation (not, no, never, n't, without, none, neither/nor, cannot, and a few non-English
      equivalents). In contextual recall, a statement whose negation differs from the negation of the
      best-matching clause of the supporting chunk is unsupported ("negation mismatch").
    * Weights terms by an IDF computed over the request (statements + evidence), boosts proper nouns,
      acronyms and numbers, discounts very common English words, and expands acronyms defined in the
      request (``two-factor authentication (2FA)``).
    * Contextual recall: a statement is supported by the best single chunk, or by the union of two
      adjacent chunks when neither alone suffices, if the weighted share of its key terms found there is
      at least ``support_threshold`` and numbers and negation agree.
    * Context coverage: a context item is used when the answer contains at least ``coverage_threshold`` of
      its weighted key terms (with a minimum of distinctive matches), or when an answer sentence is mostly
      made of the item's terms (long items).

What it cannot do
    * Paraphrase with different vocabulary and synonyms ("lowers blood pressure" vs "reduces
      hypertension"), antonyms without a negation word ("rose" vs "fell"), word order and roles
      ("A acquired B" vs "B acquired A"), multi-hop reasoning, arithmetic, dates written differently
      (``1879-03-14`` vs ``14 March 1879``), coreference beyond dropping pronouns, approximate numbers
      (``about 1.5 million`` does not match ``1,523,000``), number words beyond English, ``10.000`` read
      as a German thousands separator (it is read as ten).
    * Negation scope is approximated by clauses; double negation and negative words ("failed", "lacks")
      are not understood. Stemming is English-centred; inflected Russian or Arabic words do not match.
    * A statement bundling several claims where only a minor term is missing can still pass the
      threshold: partial support is caught only when the missing part carries enough weight.

Its verdicts are stable: same request, same verdicts, on any machine. Bump ``PROMPT_VERSION`` whenever a
change here can change a verdict (it is part of every cache key).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from recall_tasks.judges.base import JudgeRequest, JudgeResponse, JudgeVerdict

__all__ = ["LexicalJudge", "PROMPT_VERSION", "extract_numbers", "key_terms", "stem"]

PROMPT_VERSION: Final = "lexical-v1"
MODEL_NAME: Final = "lexical"

DEFAULT_SUPPORT_THRESHOLD: Final = 0.65
DEFAULT_COVERAGE_THRESHOLD: Final = 0.4

# Weighting (part of the algorithm: changing any of them needs a PROMPT_VERSION bump).
_IDF_STRENGTH: Final = 0.5  # weight = 1 + strength * ln((N + 1) / (df + 1)), df excluding the own text
_NUMBER_WEIGHT: Final = 2.0
_PROPER_WEIGHT: Final = 1.5
_GENERIC_WEIGHT: Final = 0.4
_CJK_UNIGRAM_WEIGHT: Final = 0.5
_QUESTION_WEIGHT: Final = 0.75  # terms the question already names may be left implicit by the evidence
# Context coverage, second path (long items): one answer sentence mostly made of the item's terms.
_SENTENCE_SHARE: Final = 0.6
_SENTENCE_MIN_TERMS: Final = 3

# --------------------------------------------------------------------------------------------------
# Word lists
# --------------------------------------------------------------------------------------------------

_PRONOUNS: Final = frozenset(
    "i me my mine myself we us our ours ourselves you your yours yourself yourselves he him his himself "
    "she her hers herself it its itself they them their theirs themselves this that these those who whom "
    "whose which what whatever whoever one's".split()
)

_STOP_EN: Final = frozenset(
    "a an the and or but if then else of at by for with about against between into through during before "
    "after above below to from up down in out on off over under again further once here there when where "
    "why how all any both each few more most other some such only own same so than too very can will just "
    "should now is am are was were be been being have has had having do does did doing would could may "
    "might must shall also as until while because since though although whether either yet via per upon "
    "within among amongst around across along toward towards onto unto like unlike etc eg ie vs versus "
    "mr mrs ms dr st am pm yes ok okay let lets thus hence therefore however whereas whilst still even "
    "ever really quite rather s t d ll m o re ve y".split()
)

_STOP_OTHER: Final = frozenset(
    # Spanish
    "el la los las lo un una unos unas de del al y e o u que en es fue fueron era eran ser ha han por para "
    "con se su sus como mas pero este esta estos estas ese esa muy tambien le les nos ya entre sobre hasta "
    "desde cuando donde porque "
    # French
    "le les l des du d et ou est sont au aux dans pour sur avec ce cet cette ces qui qu il elle ils elles "
    "on nous vous sa ses leur leurs ete etait etaient mais aussi tres "
    # German
    "der das und ist von zu zum zur den dem des ein eine einer eines einem einen im mit auf fur sich wurde "
    "wurden sind auch als bei nach aus oder dass er sie es wir um".split()
)

_STOP: Final = _STOP_EN | _STOP_OTHER | _PRONOUNS

_NEGATIONS: Final = frozenset(
    "not no never none neither nor without cannot nobody nothing nowhere "
    "nunca jamas sin ni ningun ninguno ninguna tampoco "
    "ne pas jamais sans aucun aucune rien "
    "nicht kein keine keinen keinem keiner keines nie niemals ohne nichts weder "
    "non nao nem senza "
    "не нет никогда без ни δεν μην μη οχι χωρις".split()
)

_CLAUSE_WORDS: Final = frozenset(
    "but however whereas while although though yet pero sino mais cependant aber sondern jedoch".split()
)

_WORD_UNITS: Final[dict[str, int]] = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen".split()
    )
}
_WORD_TENS: Final[dict[str, int]] = {
    w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)
}
_WORD_SMALL: Final[dict[str, int]] = {**_WORD_UNITS, **_WORD_TENS}
_SCALE_WORDS: Final[dict[str, float]] = {
    "hundred": 1e2,
    "thousand": 1e3,
    "million": 1e6,
    "millions": 1e6,
    "billion": 1e9,
    "billions": 1e9,
    "trillion": 1e12,
    "trillions": 1e12,
    "mil": 1e3,
    "millon": 1e6,
    "millones": 1e6,
    "mille": 1e3,
    "milliard": 1e9,
    "milliards": 1e9,
    "tausend": 1e3,
    "millionen": 1e6,
    "milliarde": 1e9,
    "milliarden": 1e9,
    "lakh": 1e5,
    "crore": 1e7,
}
_PERCENT_WORDS: Final = frozenset({"percent", "pct", "prozent", "percentage", "porcentaje", "pourcent"})
_PERCENT_PAIRS: Final = frozenset({("per", "cent"), ("por", "ciento"), ("pour", "cent")})
_ATTACHED_SCALES: Final[dict[str, float]] = {"k": 1e3, "mn": 1e6, "mln": 1e6, "bn": 1e9, "tn": 1e12}
_CJK_SCALES: Final[dict[str, float]] = {"百": 1e2, "千": 1e3, "万": 1e4, "萬": 1e4, "亿": 1e8, "億": 1e8}
_ORDINAL_SUFFIXES: Final = frozenset({"st", "nd", "rd", "th", "s"})
_UNITS: Final = frozenset(
    "km kg cm mm mg ml g l lb lbs m mi ft h hr hrs min mins ms sec secs gb mb kb tb ghz mhz hz kw kwh mw "
    "gw gwh w v x yr yrs mph kph kmh oz t am pm c f".split()
)
_CURRENCY: Final[dict[str, str]] = {"$": "dollar", "€": "euro", "£": "pound", "¥": "yen", "₹": "rupee"}
# Units and spelling variants mapped to one form before stemming (5 m = 5 metres = 5 meters).
_CANONICAL: Final[dict[str, str]] = {
    **dict.fromkeys(["m", "meter", "meters", "metres"], "metre"),
    **dict.fromkeys(["km", "kilometer", "kilometers", "kilometres"], "kilometre"),
    **dict.fromkeys(["cm", "centimeter", "centimeters", "centimetres"], "centimetre"),
    **dict.fromkeys(["mm", "millimeter", "millimeters", "millimetres"], "millimetre"),
    **dict.fromkeys(["kg", "kgs", "kilo", "kilos", "kilograms"], "kilogram"),
    **dict.fromkeys(["g", "grams", "gramme", "grammes"], "gram"),
    **dict.fromkeys(["mg", "milligrams"], "milligram"),
    **dict.fromkeys(["ml", "milliliter", "milliliters", "millilitres"], "millilitre"),
    **dict.fromkeys(["l", "liter", "liters", "litres"], "litre"),
    **dict.fromkeys(["lb", "lbs", "pounds"], "pound"),
    **dict.fromkeys(["ft", "feet"], "foot"),
    **dict.fromkeys(["mi", "miles"], "mile"),
    **dict.fromkeys(["h", "hr", "hrs", "hours"], "hour"),
    **dict.fromkeys(["min", "mins", "minutes"], "minute"),
    **dict.fromkeys(["sec", "secs", "seconds"], "second"),
    **dict.fromkeys(["yr", "yrs", "years"], "year"),
    **dict.fromkeys(["kmh", "kph"], "kilometre"),
    **dict.fromkeys(["usd", "dollars"], "dollar"),
    **dict.fromkeys(["eur", "euros"], "euro"),
}

_IRREGULAR: Final[dict[str, str]] = {
    **dict.fromkeys(["won"], "win"),
    **dict.fromkeys(["held"], "hold"),
    **dict.fromkeys(["built"], "build"),
    **dict.fromkeys(["wrote", "written"], "write"),
    **dict.fromkeys(["began", "begun"], "begin"),
    **dict.fromkeys(["became"], "become"),
    **dict.fromkeys(["gave", "given"], "give"),
    **dict.fromkeys(["took", "taken"], "take"),
    **dict.fromkeys(["made"], "make"),
    **dict.fromkeys(["found"], "find"),
    **dict.fromkeys(["led"], "lead"),
    **dict.fromkeys(["sold"], "sell"),
    **dict.fromkeys(["bought"], "buy"),
    **dict.fromkeys(["taught"], "teach"),
    **dict.fromkeys(["thought"], "think"),
    **dict.fromkeys(["brought"], "bring"),
    **dict.fromkeys(["told"], "tell"),
    **dict.fromkeys(["said"], "say"),
    **dict.fromkeys(["paid"], "pay"),
    **dict.fromkeys(["ran"], "run"),
    **dict.fromkeys(["grew", "grown"], "grow"),
    **dict.fromkeys(["knew", "known"], "know"),
    **dict.fromkeys(["saw", "seen"], "see"),
    **dict.fromkeys(["went", "gone"], "go"),
    **dict.fromkeys(["came"], "come"),
    **dict.fromkeys(["got", "gotten"], "get"),
    **dict.fromkeys(["rose", "risen"], "rise"),
    **dict.fromkeys(["fell", "fallen"], "fall"),
    **dict.fromkeys(["drew", "drawn"], "draw"),
    **dict.fromkeys(["spoke", "spoken"], "speak"),
    **dict.fromkeys(["chose", "chosen"], "choose"),
    **dict.fromkeys(["broke", "broken"], "break"),
    **dict.fromkeys(["ate", "eaten"], "eat"),
    **dict.fromkeys(["flew", "flown"], "fly"),
    **dict.fromkeys(["drove", "driven"], "drive"),
    **dict.fromkeys(["met"], "meet"),
    **dict.fromkeys(["kept"], "keep"),
    **dict.fromkeys(["sent"], "send"),
    **dict.fromkeys(["spent"], "spend"),
    **dict.fromkeys(["lost"], "lose"),
    **dict.fromkeys(["meant"], "mean"),
    **dict.fromkeys(["felt"], "feel"),
    **dict.fromkeys(["stood"], "stand"),
    **dict.fromkeys(["understood"], "understand"),
    **dict.fromkeys(["fought"], "fight"),
    **dict.fromkeys(["caught"], "catch"),
    **dict.fromkeys(["sought"], "seek"),
    **dict.fromkeys(["struck"], "strike"),
    **dict.fromkeys(["wore", "worn"], "wear"),
    **dict.fromkeys(["hid", "hidden"], "hide"),
    **dict.fromkeys(["shot"], "shoot"),
    **dict.fromkeys(["sat"], "sit"),
    **dict.fromkeys(["slept"], "sleep"),
    **dict.fromkeys(["sang", "sung"], "sing"),
    **dict.fromkeys(["swam", "swum"], "swim"),
    **dict.fromkeys(["threw", "thrown"], "throw"),
    **dict.fromkeys(["laid"], "lay"),
    **dict.fromkeys(["dealt"], "deal"),
    **dict.fromkeys(["fled"], "flee"),
    **dict.fromkeys(["shown"], "show"),
    **dict.fromkeys(["children"], "child"),
    **dict.fromkeys(["men"], "man"),
    **dict.fromkeys(["women"], "woman"),
    **dict.fromkeys(["feet"], "foot"),
    **dict.fromkeys(["teeth"], "tooth"),
    **dict.fromkeys(["mice"], "mouse"),
    **dict.fromkeys(["people"], "person"),
}

# Very common English content words: they carry little of a statement's meaning, so missing ones cost less.
_GENERIC_WORDS: Final = (
    "make take get give go know see use find tell ask work seem feel try leave call keep let begin "
    "show hear play run move live believe hold bring happen write provide sit stand lose pay meet include "
    "continue set learn change lead understand follow stop create speak read allow add spend grow open "
    "offer remember consider appear wait serve send expect build stay fall reach remain suggest raise pass "
    "require report decide develop receive explain describe base help need mean become put say "
    "think look want start turn involve perform ensure contain support refer result occur exist "
    "list mention regard concern indicate represent associate identify establish "
    "determine produce achieve obtain apply form implement feature carry place "
    "thing way part kind type lot time example case fact point place area side end level order amount "
    "range variety manner aspect detail item instance sort piece deal "
    "new good high large big small important different various main major many several well often usually "
    "generally certain specific particular available current recent common general whole full total real "
    "possible likely early late long great little old young first last next best better less key overall "
    "known called located based able including regarding according "
    # nouns derived from the verbs above
    "explanation description information creation production inclusion provision requirement "
    "representation establishment determination identification association indication suggestion "
    "consideration description application performance development achievement"
).split()


# --------------------------------------------------------------------------------------------------
# Stemming
# --------------------------------------------------------------------------------------------------

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


_GENERIC: Final = frozenset(stem(w) for w in _GENERIC_WORDS)

# --------------------------------------------------------------------------------------------------
# Normalisation and scanning
# --------------------------------------------------------------------------------------------------

_CJK_CLASS: Final = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_LETTER: Final = rf"[^\W\d_{_CJK_CLASS}]"
_TOKEN_RE: Final = re.compile(
    rf"(?P<word>{_LETTER}+(?:['’]{_LETTER}+)*(?:-{_LETTER}+)*(?:\d+{_LETTER}*)*)"
    rf"|(?P<num>\d+(?:[.,]\d+)*)(?P<suf>{_LETTER}+|[百千万萬亿億])?(?P<pct>\s?%)?"
    rf"|(?P<cjk>[{_CJK_CLASS}]+)"
    r"|(?P<sent>[。！？]+|[.!?]+(?=\s|$|[\"'”’)\]])|\n)"
    r"|(?P<clause>[;:；：])"
)
_COMBINING_RE: Final = re.compile("[\u0300-\u036f]")
_DOTTED_RE: Final = re.compile(r"\b(?:[A-Za-z]\.){2,}")

_CJK_STOP: Final = frozenset("的了是在和与與及也都被把这這那之于於着著並并且其他她它我你们們・はがをにでのともへや")
_CJK_NEG_CHARS: Final = frozenset("不没沒无無未非")
_CJK_NEG_EXCEPTIONS: Final = frozenset(
    ["非常", "未来", "未來", "不仅", "不僅", "不过", "不過", "不断", "不斷", "无论", "無論", "不论", "不論"]
)
_JA_NEG: Final = ("ない", "ません", "なかった")
_ELISIONS: Final = frozenset("l d j m n s t c qu jusqu lorsqu puisqu dell all nell sull un".split())

# Raw token kinds of the first pass: word, number, CJK run, sentence end, clause end, hyphenated word,
# identifier (letters and digits: 2FA, COVID19), unit attached to a number (5km).
_W, _N, _C, _S, _K, _H, _I, _U = range(8)


def _normalize(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    if not text.isascii():
        text = unicodedata.normalize("NFC", _COMBINING_RE.sub("", unicodedata.normalize("NFD", text)))
    if "." in text:
        text = _DOTTED_RE.sub(lambda m: m.group(0).replace(".", ""), text)
    return text


def _parse_numeral(s: str) -> float | None:
    """``1,500,000`` → 1500000; ``3.14`` → 3.14; ``1,5`` → 1.5; ``1.500.000`` → 1500000; ``3.11.2`` → None."""
    if "," in s and "." in s:
        if s.rfind(",") > s.rfind("."):
            s = s.replace(".", "").replace(",", ".")
        else:
            s = s.replace(",", "")
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


def _number_key(value: float) -> str:
    return f"#{value:.12g}"


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return 0x3040 <= o <= 0x30FF or 0x3400 <= o <= 0x9FFF or 0xF900 <= o <= 0xFAFF or 0xAC00 <= o <= 0xD7AF


@lru_cache(maxsize=65536)
def _word_term(lw: str) -> str | None:
    """Content term of a casefolded word, or None for stop words and single letters."""
    if lw in _STOP or lw in _NEGATIONS:
        return None
    if len(lw) == 1 and lw.isascii():
        return None
    return stem(_CANONICAL.get(lw, lw))


RawToken = tuple[int, str, int, int, float]  # kind, text, start, end, value


def _scan(text: str) -> list[RawToken]:
    raws: list[RawToken] = []
    append = raws.append
    for m in _TOKEN_RE.finditer(text):
        word = m.group("word")
        if word is not None:
            if any(ch.isdigit() for ch in word):
                append((_I, word, m.start(), m.end(), 0.0))
            elif "-" in word:
                parts = word.split("-")
                if all(p.casefold() in _WORD_SMALL or p.casefold() in _SCALE_WORDS for p in parts):
                    for p in parts:
                        append((_W, p, m.start(), m.end(), 0.0))
                else:
                    append((_H, word, m.start(), m.end(), 0.0))
            else:
                append((_W, word, m.start(), m.end(), 0.0))
            continue
        num = m.group("num")
        if num is not None:
            suffix = m.group("suf")
            value = _parse_numeral(num)
            if value is None:
                append((_I, num + (suffix or ""), m.start(), m.end(), 0.0))
                continue
            unit = None
            if suffix:
                lsuf = suffix.casefold()
                currency = m.start() > 0 and text[m.start() - 1] in _CURRENCY
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
                else:
                    append((_I, num + suffix, m.start(), m.end(), 0.0))
                    continue
            surface = m.group(0).strip() if unit is None else num
            if m.start() > 0 and text[m.start() - 1] in _CURRENCY:
                append((_U, _CURRENCY[text[m.start() - 1]], m.start() - 1, m.start(), -1.0))
            append((_N, surface, m.start(), m.end(), value))
            if unit is not None:
                append((_U, unit, m.end() - len(unit), m.end(), 0.0))
            continue
        cjk = m.group("cjk")
        if cjk is not None:
            append((_C, cjk, m.start(), m.end(), 0.0))
        elif m.group("sent") is not None:
            append((_S, "", m.start(), m.end(), 0.0))
        else:
            append((_K, "", m.start(), m.end(), 0.0))
    return raws


# --------------------------------------------------------------------------------------------------
# Analysis of one text
# --------------------------------------------------------------------------------------------------


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
    proper: frozenset[str]  # terms seen capitalised inside a sentence, acronyms, identifiers
    acronyms: tuple[tuple[str, frozenset[str]], ...]  # acronym term → terms of its expansion
    surface: dict[str, str]  # term → how it was written (for reasons)


class _Builder:
    """Accumulates the terms of one text; split out of :func:`_analyze` to keep it readable."""

    __slots__ = ("terms", "seen", "alts", "numbers", "clauses", "clause", "clause_neg", "negated", "proper",
                 "surface", "acronyms")

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
        self.clause = set()
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


def _cjk_terms(run: str, after_digit: bool, before_digit: bool, b: _Builder) -> None:
    for i, ch in enumerate(run):
        if ch in _CJK_NEG_CHARS and run[i : i + 2] not in _CJK_NEG_EXCEPTIONS and (
            i == 0 or run[i - 1 : i + 1] not in _CJK_NEG_EXCEPTIONS
        ):
            b.negate()
            break
    else:
        if any(neg in run for neg in _JA_NEG):
            b.negate()
    segments: list[str] = []
    current: list[str] = []
    for i, ch in enumerate(run):
        if ch in _CJK_STOP:
            if current:
                segments.append("".join(current))
                current = []
            continue
        current.append(ch)
        # a measure word right after a number (1879年) or a prefix right before one (第3) stands alone
        if (after_digit and i == 0) or (before_digit and i == len(run) - 2):
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


def _acronym_expansion(acronym: str, recent: list[tuple[str, str | None]]) -> frozenset[str] | None:
    """Terms of the words an acronym abbreviates, e.g. ``two-factor authentication (2FA)``."""
    letters = acronym.casefold()
    n = len(letters)
    content = [r for r in recent if r[0] not in _STOP]
    for window in (recent[-n:], content[-n:]):
        if len(window) != n:
            continue
        ok = True
        for ch, (word, _term) in zip(letters, window, strict=True):
            if ch.isdigit():
                if _WORD_SMALL.get(word) != int(ch) and word != ch:
                    ok = False
                    break
            elif not word.startswith(ch):
                ok = False
                break
        if ok:
            expansion = frozenset(t for _w, t in window if t)
            return expansion or None
    return None


@lru_cache(maxsize=8192)
def _analyze(text: str) -> _Analysis:
    norm = _normalize(text)
    raws = _scan(norm)
    b = _Builder()
    recent: list[tuple[str, str | None]] = []  # words of the current sentence, for acronym expansion
    initial = True
    n = len(raws)
    i = 0
    while i < n:
        kind, raw, start, end, value = raws[i]
        if kind == _S:
            b.close_clause()
            recent = []
            initial = True
            i += 1
            continue
        if kind == _K:
            b.close_clause()
            i += 1
            continue
        if kind == _C:
            after = start > 0 and norm[start - 1].isdigit()
            before = end < len(norm) and norm[end].isdigit()
            _cjk_terms(raw, after, before, b)
            initial = False
            i += 1
            continue
        lw = raw.casefold() if kind != _N else ""
        if kind == _N or (kind == _W and (lw in _WORD_SMALL or (lw in ("a", "an") and _next_is_scale(raws, i)))):
            i = _read_number(raws, i, b, norm)
            initial = False
            continue
        if kind == _U:
            unit_term = stem(_CANONICAL.get(lw, lw))
            if value < 0:
                b.alt(unit_term)  # "$" reads as "dollar" but is never required
            else:
                b.add(unit_term, raw)
            initial = False
            i += 1
            continue
        if kind == _I:
            term = lw
            b.add(term, lw)
            b.proper.add(term)
            if _in_parentheses(norm, start, end) and raw.upper() == raw:
                _maybe_acronym(term, raw, recent, b)
            recent.append((lw, term))
            initial = False
            i += 1
            continue
        if kind == _H:
            parts = raw.split("-")
            joined_terms = []
            for k, part in enumerate(parts):
                lp = part.casefold()
                if lp in _WORD_SMALL:
                    recent.append((lp, None))
                    continue
                term = _word_term(lp)
                recent.append((lp, term))
                if term is None:
                    continue
                joined_terms.append(term)
                b.add(term, lp)
                if part[0].isupper() and (k > 0 or not initial):
                    b.proper.add(term)
            joined = _word_term(raw.casefold().replace("-", ""))
            if joined and joined not in joined_terms:
                b.alt(joined)
            initial = False
            i += 1
            continue
        # plain word
        initial_word = initial
        initial = False
        i += 1
        if "'" in lw or "’" in lw:
            lw = lw.replace("’", "'")
            if lw.endswith("n't"):
                b.negate()
                continue
            head, _, tail = lw.partition("'")
            if tail in ("s", "re", "ve", "ll", "d", "m", "t"):
                lw = head
            elif head in _ELISIONS:
                if head == "n":
                    b.negate()
                lw = tail
            else:
                lw = lw.replace("'", "")
        if lw in _NEGATIONS:
            if not (lw == "not" and i < n and raws[i][0] == _W and raws[i][1].casefold() == "only"):
                b.negate()
            continue
        if lw in _CLAUSE_WORDS:
            b.close_clause()
            continue
        term = _word_term(lw)
        recent.append((lw, term))
        if term is None:
            continue
        b.add(term, lw)
        if raw[0].isupper() and (not initial_word or (len(raw) > 1 and raw.isupper())):
            b.proper.add(term)
        if len(raw) > 1 and raw.isupper() and _in_parentheses(norm, start, end):
            _maybe_acronym(term, raw, recent[:-1], b)
    return b.build()


def _in_parentheses(text: str, start: int, end: int) -> bool:
    return start > 0 and text[start - 1] == "(" and end < len(text) and text[end] == ")"


def _maybe_acronym(term: str, raw: str, recent: list[tuple[str, str | None]], b: _Builder) -> None:
    expansion = _acronym_expansion(raw, [r for r in recent if r[1] != term])
    if expansion:
        b.acronyms.append((term, expansion))


def _next_is_scale(raws: list[RawToken], i: int) -> bool:
    return i + 1 < len(raws) and raws[i + 1][0] == _W and raws[i + 1][1].casefold() in _SCALE_WORDS


def _read_number(raws: list[RawToken], i: int, b: _Builder, norm: str) -> int:
    """Read a number starting at ``raws[i]`` (numeral or number words), record it, return the next index."""
    n = len(raws)
    words: list[str] = []
    kind, raw, _s, _e, value = raws[i]
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
    if kind == _W and [w.casefold() for w in words] == ["one"]:
        b.alt(key)  # "one of the founders" is rarely a quantity: matchable, never required
    else:
        b.add(key, surface)
        b.numbers.append(key)
    return j


def key_terms(text: str) -> list[str]:
    """The content terms the judge matches for ``text`` (stems, CJK bigrams, ``#<number>`` keys)."""
    return list(_analyze(text).terms)


def extract_numbers(text: str) -> list[float]:
    """The numbers of ``text`` as floats: ``"1.5 million and 12%"`` → ``[1500000.0, 12.0]``."""
    return [float(k[1:]) for k in _analyze(text).numbers]


# --------------------------------------------------------------------------------------------------
# The judge
# --------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Candidate:
    ids: tuple[int, ...]  # 0-based evidence indexes (one chunk, or two adjacent ones)
    coverage: float
    matched: frozenset[str]


class _Request:
    """Per-request state: analyses, weights, match sets."""

    def __init__(self, request: JudgeRequest) -> None:
        self.statements = [_analyze(s) for s in request.statements]
        self.evidence = [_analyze(e) for e in request.evidence]
        docs = self.statements + self.evidence
        self.n_docs = len(docs)
        acronyms: dict[str, frozenset[str]] = {}
        for d in docs:
            for acr, exp in d.acronyms:
                acronyms[acr] = acronyms.get(acr, frozenset()) | exp
        self.match: list[frozenset[str]] = []
        for e in self.evidence:
            m = e.match
            if acronyms:
                extra: set[str] = set()
                for acr, exp in acronyms.items():
                    if acr in m:
                        extra |= exp
                    elif exp <= m:
                        extra.add(acr)
                if extra:
                    m = m | extra
            self.match.append(m)
        self.df: Counter[str] = Counter()
        for d in docs:
            self.df.update(d.match)
        self.proper: set[str] = set()
        for d in docs:
            self.proper |= d.proper
        self.question = frozenset(_analyze(request.question).terms) if request.question else frozenset()
        self._weights: dict[str, float] = {}

    def weight(self, term: str) -> float:
        w = self._weights.get(term)
        if w is not None:
            return w
        df_other = max(self.df.get(term, 1) - 1, 1)
        w = 1.0 + _IDF_STRENGTH * math.log((self.n_docs + 1) / (df_other + 1))
        if term[0] == "#":
            w *= _NUMBER_WEIGHT
        elif term in self.proper:
            w *= _PROPER_WEIGHT
        elif term in _GENERIC:
            w *= _GENERIC_WEIGHT
        elif len(term) == 1 and _is_cjk(term):
            w *= _CJK_UNIGRAM_WEIGHT
        if term in self.question:
            w *= _QUESTION_WEIGHT
        self._weights[term] = w
        return w


def _missing_reason(prefix: str, analysis: _Analysis, missing: list[tuple[float, str]]) -> str:
    missing.sort(key=lambda x: -x[0])
    names = ", ".join(f"'{analysis.surface.get(t, t)}'" for _w, t in missing[:4])
    more = f" (+{len(missing) - 4} more)" if len(missing) > 4 else ""
    return f"{prefix}: missing {names}{more}" if names else f"{prefix}: no key terms in common"


def _chunks_label(ids: tuple[int, ...]) -> str:
    return f"chunk {ids[0] + 1}" if len(ids) == 1 else f"chunks {ids[0] + 1}+{ids[1] + 1}"


class LexicalJudge:
    """Offline, deterministic judge by weighted key-term overlap (see the module docstring for its limits)."""

    def __init__(
        self,
        support_threshold: float = DEFAULT_SUPPORT_THRESHOLD,
        coverage_threshold: float = DEFAULT_COVERAGE_THRESHOLD,
    ) -> None:
        for name, value in (("support_threshold", support_threshold), ("coverage_threshold", coverage_threshold)):
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        self.support_threshold = float(support_threshold)
        self.coverage_threshold = float(coverage_threshold)

    @property
    def model(self) -> str:
        return MODEL_NAME

    @property
    def prompt_version(self) -> str:
        return PROMPT_VERSION

    def config(self) -> dict[str, Any]:
        return {
            "judge": MODEL_NAME,
            "version": PROMPT_VERSION,
            "support_threshold": self.support_threshold,
            "coverage_threshold": self.coverage_threshold,
        }

    async def judge(self, request: JudgeRequest) -> JudgeResponse:
        return self.judge_sync(request)

    def judge_sync(self, request: JudgeRequest) -> JudgeResponse:
        """Decide every statement of ``request``; pure CPU, deterministic."""
        with_reason = request.include_reason
        if not request.statements:
            verdicts: list[JudgeVerdict] = []
        elif not any(e.strip() for e in request.evidence):
            reason = "no evidence" if with_reason else ""
            verdicts = [
                JudgeVerdict(id=k, verdict="no", reason=reason) for k in range(1, len(request.statements) + 1)
            ]
        else:
            ctx = _Request(request)
            decide = self._recall if request.task == "contextual_recall" else self._coverage
            verdicts = [decide(ctx, k, with_reason) for k in range(len(request.statements))]
        yes = sum(v.verdict == "yes" for v in verdicts)
        word = "supported" if request.task == "contextual_recall" else "used"
        return JudgeResponse(
            verdicts=verdicts,
            summary=f"lexical: {yes}/{len(verdicts)} {word}",
            model=MODEL_NAME,
            prompt_version=PROMPT_VERSION,
            prompt_tokens=0,
            completion_tokens=0,
            cost_usd=0.0,
            requests=0,
        )

    # -- contextual recall: statement = expected-output sentence, evidence = context chunks ------------

    def _recall(self, ctx: _Request, k: int, with_reason: bool) -> JudgeVerdict:
        st = ctx.statements[k]
        terms = st.terms
        if not terms:
            return JudgeVerdict(id=k + 1, verdict="no", reason="no key terms to check" if with_reason else "")
        weights = {t: ctx.weight(t) for t in terms}
        total = sum(weights.values())
        singles: list[_Candidate] = []
        for idx, m in enumerate(ctx.match):
            matched = frozenset(t for t in terms if t in m)
            singles.append(_Candidate((idx,), sum(weights[t] for t in matched) / total, matched))
        pairs: list[_Candidate] = []
        for idx in range(len(singles) - 1):
            a, b = singles[idx], singles[idx + 1]
            union = a.matched | b.matched
            if len(union) > max(len(a.matched), len(b.matched)) and a.matched and b.matched:
                pairs.append(_Candidate((idx, idx + 1), sum(weights[t] for t in union) / total, union))
        singles.sort(key=lambda c: (-c.coverage, c.ids))
        pairs.sort(key=lambda c: (-c.coverage, c.ids))
        threshold = self.support_threshold
        failure: tuple[_Candidate, str] | None = None  # best candidate that failed on numbers or negation
        for cand in singles + pairs:
            if cand.coverage >= threshold:
                problem = self._gate(ctx, st, cand, weights)
                if problem is None:
                    reason = ""
                    if with_reason:
                        reason = f"supported by {_chunks_label(cand.ids)} ({cand.coverage:.0%} of key terms)"
                    return JudgeVerdict(
                        id=k + 1, verdict="yes", reason=reason, chunk_ids=[i + 1 for i in cand.ids]
                    )
                if failure is None:
                    failure = (cand, problem)
            elif failure is None and st.numbers:
                # below the threshold only because its numbers differ: report a number mismatch
                lost = sum(weights[t] for t in st.numbers if t not in cand.matched) / total
                if lost and cand.coverage + lost >= threshold:
                    failure = (cand, "number")
        if not with_reason:
            return JudgeVerdict(id=k + 1, verdict="no")
        if failure is not None:
            cand, problem = failure
            if problem == "number":
                return JudgeVerdict(id=k + 1, verdict="no", reason=self._number_reason(ctx, st, cand))
            if problem == "entity":
                missing = [(weights[t], t) for t in terms if t not in cand.matched]
                return JudgeVerdict(id=k + 1, verdict="no", reason=_missing_reason("not supported", st, missing))
            return JudgeVerdict(id=k + 1, verdict="no", reason=f"negation mismatch with {_chunks_label(cand.ids)}")
        best = max(singles[:1] + pairs[:1], key=lambda c: (c.coverage, -len(c.ids)))
        missing = [(weights[t], t) for t in terms if t not in best.matched]
        return JudgeVerdict(id=k + 1, verdict="no", reason=_missing_reason("not supported", st, missing))

    @staticmethod
    def _gate(ctx: _Request, st: _Analysis, cand: _Candidate, weights: dict[str, float]) -> str | None:
        """``None`` when entities, numbers and negation agree, else ``"entity"``, ``"number"``, ``"negation"``."""
        for t in st.proper:
            if t not in cand.matched and t not in ctx.question:
                return "entity"
        if st.numbers:
            available = ctx.match[cand.ids[0]]
            if len(cand.ids) > 1:
                available = available | ctx.match[cand.ids[1]]
            if any(t not in available for t in st.numbers):
                return "number"
        best_weight = -1.0
        negated = False
        for idx in cand.ids:
            for clause in ctx.evidence[idx].clauses:
                w = sum(weights[t] for t in cand.matched if t in clause.terms)
                if w > best_weight:
                    best_weight = w
                    negated = clause.negated
        if negated != st.negated:
            return "negation"
        return None

    @staticmethod
    def _number_reason(ctx: _Request, st: _Analysis, cand: _Candidate) -> str:
        available: list[tuple[str, str]] = []  # (key, surface) of the candidate's numbers
        for idx in cand.ids:
            ev = ctx.evidence[idx]
            available.extend((t, ev.surface.get(t, t[1:])) for t in ev.numbers)
        keys = {t for t, _s in available}
        missing = [t for t in st.numbers if t not in keys]
        shown = st.surface.get(missing[0], missing[0][1:])
        if not available:
            return f"number mismatch: {shown} not in {_chunks_label(cand.ids)}"
        target = float(missing[0][1:])
        closest = sorted(dict(available).items(), key=lambda kv: (abs(float(kv[0][1:]) - target), kv[0]))
        return f"number mismatch: {shown} vs {', '.join(s for _k, s in closest[:2])}"

    # -- context coverage: statement = context item, evidence = answer sentences -----------------------

    def _coverage(self, ctx: _Request, k: int, with_reason: bool) -> JudgeVerdict:
        item = ctx.statements[k]
        terms = item.terms
        if not terms:
            return JudgeVerdict(id=k + 1, verdict="no", reason="no key terms to check" if with_reason else "")
        weights = {t: ctx.weight(t) for t in terms}
        total = sum(weights.values())
        distinctive = [t for t in terms if t not in _GENERIC]
        per_sentence: list[tuple[float, frozenset[str]]] = []
        union: set[str] = set()
        for m in ctx.match:
            matched = frozenset(t for t in terms if t in m)
            per_sentence.append((sum(weights[t] for t in matched), matched))
            union |= matched
        share = sum(weights[t] for t in union) / total
        strong = any(t[0] == "#" or t in ctx.proper for t in union)
        needed = min(2, len(distinctive)) if distinctive else 1
        used = share >= self.coverage_threshold and (
            strong or sum(t not in _GENERIC for t in union) >= needed
        )
        if not used:
            # long items: an answer sentence mostly made of the item's terms uses it
            for idx, (w, matched) in enumerate(per_sentence):
                if sum(t not in _GENERIC for t in matched) < _SENTENCE_MIN_TERMS:
                    continue
                sentence_total = sum(ctx.weight(t) for t in ctx.evidence[idx].terms)
                if sentence_total and w / sentence_total >= _SENTENCE_SHARE:
                    used = True
                    break
        if not used:
            reason = ""
            if with_reason:
                missing = [(weights[t], t) for t in terms if t not in union]
                reason = _missing_reason("not used", item, missing)
                if union:
                    reason += f" ({share:.0%} of key terms)"
            return JudgeVerdict(id=k + 1, verdict="no", reason=reason)
        top = max(w for w, _m in per_sentence)
        ids = [
            idx + 1
            for idx, (w, matched) in enumerate(per_sentence)
            if w > 0 and w >= 0.5 * top and any(t not in _GENERIC for t in matched)
        ]
        reason = ""
        if with_reason:
            where = "answer sentence" + ("s " if len(ids) > 1 else " ") + ", ".join(map(str, ids))
            reason = f"used in {where} ({share:.0%} of key terms)"
        return JudgeVerdict(id=k + 1, verdict="yes", reason=reason, chunk_ids=ids)
