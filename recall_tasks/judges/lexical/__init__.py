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
    * Stems Latin-script words with snowballstemmer's English (Porter2) stemmer after a small table of irregular
      forms (``encrypted``/``encryption``, ``developed``/``development``, ``won``/``win``); maps unit spellings
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
change anywhere in this package can change a verdict (it is part of every cache key).

Layout (each module imports only the ones above it)
    * ``lexicon``: the word lists: stop words, negations, number words, units and spelling variants,
      irregular forms, very common English words.
    * ``stemmer``: ``stem``, Porter2 (snowballstemmer) after the irregular forms.
    * ``tokens``: normalisation and the two-pass scanner: raw tokens, numerals, what a word is.
    * ``analysis``: one text's key terms, numbers, clauses, names and acronyms (``key_terms``,
      ``extract_numbers``).
    * ``judge``: ``LexicalJudge``, its thresholds and weighting, ``PROMPT_VERSION``.
"""

from __future__ import annotations

from recall_tasks.judges.lexical.analysis import extract_numbers, key_terms
from recall_tasks.judges.lexical.judge import PROMPT_VERSION, LexicalJudge
from recall_tasks.judges.lexical.stemmer import stem

__all__ = ["LexicalJudge", "PROMPT_VERSION", "extract_numbers", "key_terms", "stem"]
