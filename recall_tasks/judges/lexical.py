"""The offline lexical judge: deterministic, no API key, no network, no model files.

``LexicalJudge`` decides statements by weighted overlap of normalised *key terms*. It is the judge of demos
and CI and a cheap baseline; it is not a substitute for an LLM judge on real evaluations. On the hand-labelled
examples of ``tests/data/lexical_labelled.jsonl`` it agrees with the labels on about 97% of the ordinary
cases and on 1 of the 25 deliberately hard ones (paraphrase with other words, antonyms, unit conversion).

What it does
    * Normalises text: Unicode NFKC, casefold, accents stripped for matching (``Málaga`` = ``Malaga``),
      dotted acronyms joined (``U.S.`` = ``US``), punctuation dropped, a compact stop list removed (English
      plus the commonest Spanish/French/German function words, and pronouns: the question may resolve them,
      so they never count as missing).
    * Stems Latin-script words with a light Porter-like suffix stemmer and a small table of irregular forms
      (``encrypted``/``encryption``, ``developed``/``development``, ``won``/``win``); maps unit spellings
      to one form (``m``/``metres``/``meters``).
    * Splits Chinese, Japanese and Korean runs into character bigrams (no spaces to split on), cut at
      particles such as 的/是/は/が; other scripts (Cyrillic, Greek, Arabic...) are kept as whole words.
    * Compares numbers as numbers: ``1,500,000`` = ``1.5 million`` = ``1.5M`` = ``1500000``,
      ``12%`` = ``12 percent`` = ``twelve per cent``, ``3k`` = ``3000``, ``150万`` = ``1.5 million``;
      ``1879`` != ``1897``.
    * Weights terms by an IDF computed over the request (statements + evidence), boosts numbers, proper
      nouns and acronyms, discounts very common English words and words the question already names, and
      expands acronyms defined in the request (``two-factor authentication (2FA)``).
    * Contextual recall: a statement is supported by the best single chunk, or by the union of two adjacent
      chunks when neither alone suffices, when the weighted share of its key terms found there reaches
      ``support_threshold`` and three checks pass: every number of the statement is in that evidence
      ("number mismatch"; extra numbers in the evidence are fine), every named entity of the statement
      (capitalised inside the sentence, or an acronym) is there unless the question names it, and the
      statement is negated (not, no, never, n't, without, none, neither/nor, cannot, and a few non-English
      equivalents) exactly when the best-matching clause of the evidence is ("negation mismatch").
    * Context coverage: a context item is used when the answer contains at least ``coverage_threshold`` of
      its weighted key terms (with at least two distinctive ones, or one number or name), or when an answer
      sentence is mostly made of the item's terms (long items). Numbers and negation are not gates here.

What it cannot do
    * Paraphrase with different vocabulary and synonyms ("lowers blood pressure" vs "treats hypertension"),
      exonyms (Nürnberg/Nuremberg), antonyms without a negation word ("rose" vs "fell"), word order and roles
      ("A acquired B" vs "B acquired A"), multi-hop reasoning, arithmetic and unit conversion, coreference
      beyond dropping pronouns, approximate numbers ("over 21,000" vs ``21,196``), dates written as numbers
      (``1879-03-14``), version ranges (``3.12`` is not found in ``3.12.1``; ``3.12.0`` is read as ``3.12``),
      number words beyond English, ``10.000`` as a German thousands separator (it reads as ten).
    * Names are recognised by capitals, so in German every noun counts as a name that must be found;
      scripts without case (CJK) get no name check.
    * Negation scope is approximated by clauses; double negation, negative words ("failed", "lacks") and
      exceptions ("every day except Monday") are not understood. Stemming is English-centred: inflected
      Russian, Arabic or Spanish forms (``escrito``/``escrita``) do not match.
    * A statement bundling several claims can pass when the missing claim carries little weight (one
      ordinary word among many); a distractor chunk sharing most words can pass too.

Its verdicts are stable: same request, same verdicts, on any machine. Bump ``PROMPT_VERSION`` whenever a
change here can change a verdict (it is part of every cache key).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from recall_tasks.judges.base import JudgeRequest, JudgeResponse, JudgeVerdict

__all__ = ["LexicalJudge", "PROMPT_VERSION", "extract_numbers", "key_terms", "stem"]

PROMPT_VERSION: Final = "lexical-v2"
MODEL_NAME: Final = "lexical"

DEFAULT_SUPPORT_THRESHOLD: Final = 0.67
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


# --------------------------------------------------------------------------------------------------
# The judge
# --------------------------------------------------------------------------------------------------


class _Request:
    """Per-request state: analyses, IDF weights, evidence match sets and per-term evidence bitmasks."""

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
        self._masks: dict[str, int] = {}

    def weight(self, term: str) -> float:
        w = self._weights.get(term)
        if w is not None:
            return w
        df_other = max(self.df.get(term, 1) - 1, 1)  # documents other than the statement itself
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

    def mask(self, term: str) -> int:
        """Bit ``i`` set when evidence ``i`` contains ``term``."""
        mask = self._masks.get(term)
        if mask is None:
            mask = 0
            for idx, m in enumerate(self.match):
                if term in m:
                    mask |= 1 << idx
            self._masks[term] = mask
        return mask


def _missing_reason(prefix: str, analysis: _Analysis, missing: list[tuple[float, str]]) -> str:
    missing.sort(key=lambda x: -x[0])
    names = ", ".join(f"'{analysis.surface.get(t, t)}'" for _w, t in missing[:4])
    more = f" (+{len(missing) - 4} more)" if len(missing) > 4 else ""
    return f"{prefix}: missing {names}{more}" if names else f"{prefix}: no key terms in common"


def _bits(mask: int) -> tuple[int, ...]:
    """0-based indexes of the bits set in ``mask``."""
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


def _chunks_label(ids: tuple[int, ...]) -> str:
    return f"chunk {ids[0] + 1}" if len(ids) == 1 else f"chunks {ids[0] + 1}+{ids[1] + 1}"


class LexicalJudge:
    """Offline, deterministic judge by weighted key-term overlap (see the module docstring for its limits)."""

    def __init__(
        self,
        support_threshold: float = DEFAULT_SUPPORT_THRESHOLD,
        coverage_threshold: float = DEFAULT_COVERAGE_THRESHOLD,
    ) -> None:
        for name, value in (
            ("support_threshold", support_threshold),
            ("coverage_threshold", coverage_threshold),
        ):
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
            count = len(request.statements)
            verdicts = [JudgeVerdict(id=k, verdict="no", reason=reason) for k in range(1, count + 1)]
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
        weights = [ctx.weight(t) for t in terms]
        masks = [ctx.mask(t) for t in terms]
        total = sum(weights)
        n_ev = len(ctx.match)
        single = [0.0] * n_ev
        both = [0.0] * n_ev  # weight of terms found in evidence idx and idx + 1
        for w, mask in zip(weights, masks, strict=True):
            m = mask
            while m:
                low = m & -m
                single[low.bit_length() - 1] += w
                m ^= low
            m = mask & (mask >> 1)
            while m:
                low = m & -m
                both[low.bit_length() - 1] += w
                m ^= low
        # candidates (coverage, first index, bitmask of chunks): single chunks first, then adjacent pairs
        # whose union covers more than either chunk alone
        singles = sorted((-single[i] / total, i, 1 << i) for i in range(n_ev) if single[i] > 0)
        pairs = []
        for i in range(n_ev - 1):
            a, b = single[i], single[i + 1]
            union = a + b - both[i]
            if a > 0 and b > 0 and union > max(a, b) + 1e-12:
                pairs.append((-union / total, i, 3 << i))
        pairs.sort()
        numeric = [(t, w, m) for t, w, m in zip(terms, weights, masks, strict=True) if t[0] == "#"]
        threshold = self.support_threshold
        failure: tuple[int, str] | None = None  # best candidate failing a check: (bitmask, check)
        for neg_cov, _i, cmask in singles + pairs:
            coverage = -neg_cov
            if coverage >= threshold:
                problem = self._gate(ctx, st, cmask, terms, weights, masks)
                if problem is None:
                    ids = _bits(cmask)
                    reason = ""
                    if with_reason:
                        reason = f"supported by {_chunks_label(ids)} ({coverage:.0%} of key terms)"
                    chunk_ids = [i + 1 for i in ids]
                    return JudgeVerdict(id=k + 1, verdict="yes", reason=reason, chunk_ids=chunk_ids)
                if failure is None:
                    failure = (cmask, problem)
            elif failure is None and st.numbers:
                # below the threshold only because its numbers differ: report a number mismatch
                lost = sum(w for t, w, m in numeric if not m & cmask)
                if lost and coverage + lost / total >= threshold:
                    failure = (cmask, "number")
        if not with_reason:
            return JudgeVerdict(id=k + 1, verdict="no")
        if failure is not None:
            cmask, problem = failure
            ids = _bits(cmask)
            if problem == "number":
                reason = self._number_reason(ctx, st, ids)
            elif problem == "negation":
                reason = f"negation mismatch with {_chunks_label(ids)}"
            else:
                missing = [(w, t) for t, w, m in zip(terms, weights, masks, strict=True) if not m & cmask]
                reason = _missing_reason("not supported", st, missing)
            return JudgeVerdict(id=k + 1, verdict="no", reason=reason)
        best = 0
        if singles or pairs:
            best = min(singles[:1] + pairs[:1], key=lambda c: (c[0], c[2].bit_count()))[2]
        missing = [(w, t) for t, w, m in zip(terms, weights, masks, strict=True) if not m & best]
        return JudgeVerdict(id=k + 1, verdict="no", reason=_missing_reason("not supported", st, missing))

    @staticmethod
    def _gate(
        ctx: _Request,
        st: _Analysis,
        cmask: int,
        terms: tuple[str, ...],
        weights: list[float],
        masks: list[int],
    ) -> str | None:
        """``None`` when entities, numbers and negation agree, else what failed: entity, number, negation."""
        matched = {t: w for t, w, m in zip(terms, weights, masks, strict=True) if m & cmask}
        for t in st.proper:
            if t not in matched and t not in ctx.question:
                return "entity"
        for t in st.numbers:
            if t not in matched:
                return "number"
        best_weight = -1.0
        negated = False
        for idx in range(len(ctx.evidence)):
            if not cmask >> idx & 1:
                continue
            for clause in ctx.evidence[idx].clauses:
                w = sum(weight for t, weight in matched.items() if t in clause.terms)
                if w > best_weight:
                    best_weight = w
                    negated = clause.negated
        if negated != st.negated:
            return "negation"
        return None

    @staticmethod
    def _number_reason(ctx: _Request, st: _Analysis, ids: tuple[int, ...]) -> str:
        available: dict[str, str] = {}  # key → surface of the candidate's numbers
        for idx in ids:
            ev = ctx.evidence[idx]
            for t in ev.numbers:
                available.setdefault(t, ev.surface.get(t, t[1:]))
        missing = [t for t in st.numbers if t not in available]
        if not missing:  # matched only through an alternative form (acronym, "one"); should not happen
            return f"number mismatch with {_chunks_label(ids)}"
        shown = st.surface.get(missing[0], missing[0][1:])
        if not available:
            return f"number mismatch: {shown} not in {_chunks_label(ids)}"
        target = float(missing[0][1:])
        closest = sorted(available.items(), key=lambda kv: (abs(float(kv[0][1:]) - target), kv[0]))
        return f"number mismatch: {shown} vs {', '.join(s for _k, s in closest[:2])}"

    # -- context coverage: statement = context item, evidence = answer sentences -----------------------

    def _coverage(self, ctx: _Request, k: int, with_reason: bool) -> JudgeVerdict:
        item = ctx.statements[k]
        terms = item.terms
        if not terms:
            return JudgeVerdict(id=k + 1, verdict="no", reason="no key terms to check" if with_reason else "")
        weights = [ctx.weight(t) for t in terms]
        masks = [ctx.mask(t) for t in terms]
        total = sum(weights)
        n_ev = len(ctx.match)
        per_sentence = [0.0] * n_ev  # matched weight of the item's terms in each answer sentence
        distinct = [0] * n_ev  # matched distinctive (non-generic) terms in each answer sentence
        union_weight = 0.0
        union_distinct = 0
        strong = False
        for t, w, mask in zip(terms, weights, masks, strict=True):
            if not mask:
                continue
            union_weight += w
            generic = t in _GENERIC
            union_distinct += not generic
            strong = strong or t[0] == "#" or t in ctx.proper
            m = mask
            while m:
                low = m & -m
                idx = low.bit_length() - 1
                per_sentence[idx] += w
                distinct[idx] += not generic
                m ^= low
        share = union_weight / total
        n_distinctive = sum(t not in _GENERIC for t in terms)
        needed = min(2, n_distinctive) if n_distinctive else 1
        used = share >= self.coverage_threshold and (strong or union_distinct >= needed)
        if not used:
            # long items: an answer sentence mostly made of the item's terms uses it
            for idx in range(n_ev):
                if distinct[idx] < _SENTENCE_MIN_TERMS:
                    continue
                sentence_total = sum(ctx.weight(t) for t in ctx.evidence[idx].terms)
                if sentence_total and per_sentence[idx] / sentence_total >= _SENTENCE_SHARE:
                    used = True
                    break
        if not used:
            reason = ""
            if with_reason:
                missing = [(w, t) for t, w, m in zip(terms, weights, masks, strict=True) if not m]
                reason = _missing_reason("not used", item, missing)
                if union_weight:
                    reason += f" ({share:.0%} of key terms)"
            return JudgeVerdict(id=k + 1, verdict="no", reason=reason)
        top = max(per_sentence)
        ids = [idx + 1 for idx in range(n_ev) if distinct[idx] and per_sentence[idx] >= 0.5 * top]
        reason = ""
        if with_reason:
            where = "answer sentence" + ("s " if len(ids) > 1 else " ") + ", ".join(map(str, ids))
            reason = f"used in {where} ({share:.0%} of key terms)"
        return JudgeVerdict(id=k + 1, verdict="yes", reason=reason, chunk_ids=ids)
