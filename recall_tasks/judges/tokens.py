"""The one token estimate of a judge request: never below what the model's tokenizer counts.

The dry run, ``--tpm``, the cost reservation of ``--max-cost-usd``, the ``--batch`` admission and the
context-window check all take a request's tokens from :func:`request_tokens` (its body: every message, the
``response_format`` schema, the completion limit), so one request has one figure in all five.

recall-bench ships no tokenizer (the BPE tables are downloads). The estimate is an upper bound for byte-level
BPE tokenizers, checked against cl100k_base and o200k_base (OpenAI's models since GPT-4, and the tokenizers built
on them): it splits text as they pre-split it (letter runs with one leading space or punctuation character,
digit runs, punctuation runs, whitespace; their regular expression on Python's classes) and counts every piece
at its UTF-8 bytes (a token is at least one byte), except the ASCII pieces whose count is known:

- a word in ``data/tokens.txt`` (20,000 words; ``benchmarks/token_table.py`` made it from both vocabularies and
  checks the estimate against both) at the most tokens either tokenizer gives it in that place (after a space,
  alone, after a punctuation character);
- a run of ASCII digits at one token per three (every 1-3 digit string is one token in both);
- one punctuation character, optionally after a space; a run of two or three listed in the table; a run of up to
  39 spaces, 10 newlines or 20 tabs: one token.

Everything else counts its bytes: CJK and other non-ASCII letters (up to 3 tokens a character: cl100k gives rare
ones 3), emoji, ids and words the table does not hold (a random letter string takes up to a token a letter). A
known piece next to a non-ASCII character counts its bytes too (the tokenizers may join them). So the estimate is
close for English prose (1.2-1.4x the real count here: docs, prompts) and conservative for every script (1-3x
for CJK); a tokenizer of another family (SentencePiece) may count more on some text.

A chat message costs :data:`PER_MESSAGE` tokens beyond its content, the reply's priming :data:`PER_REPLY`.
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from typing import Any

#: Tokens a chat message costs beyond its content (role and separators), and the reply's priming.
PER_MESSAGE = 4
PER_REPLY = 3

#: The pre-tokenizer of cl100k_base on Python's classes (o200k_base splits the same pieces where a count is
#: claimed: a word of one case pattern, digits, punctuation, whitespace): contraction, letters with one leading
#: character, digits, punctuation with its newlines, whitespace.
_PIECES = re.compile(
    r"(?P<c>'(?i:[sdmt]|ll|ve|re))"
    r"|(?P<w>(?:[^\r\n\w]|_)?+[^\W\d_]++)"
    r"|(?P<d>\d++)"
    r"|(?P<p> ?(?:[^\s\w]|_)++[\r\n]*+)"
    r"|(?P<s>\s++\Z|\s*[\r\n]|\s+(?!\S)|\s)"
)
_PUNCT = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
#: whitespace pieces of one character repeated that are one token in both tokenizers, up to these lengths
_SPACES = {" ": 39, "\n": 10, "\t": 20}


@functools.cache
def _table() -> dict[str, dict[str, int]]:
    """``data/tokens.txt`` by form: ``s`` (after a space), ``a`` (alone), ``p`` (after one punctuation or control
    character) -> word -> tokens; ``q``/``r`` -> punctuation runs of one token (alone, after a space)."""
    table: dict[str, dict[str, int]] = {"s": {}, "a": {}, "p": {}, "q": {}, "r": {}}
    text = resources.files("recall_tasks").joinpath("data/tokens.txt").read_text(encoding="ascii")
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, items = line.partition(" ")
        if key in ("q", "r"):
            table[key].update(dict.fromkeys(items.split(), 1))
            continue
        for form, digit in zip("sap", key, strict=True):
            if digit != "0":
                table[form].update(dict.fromkeys(items.split(), int(digit)))
    return table


@functools.lru_cache(maxsize=256)  # the system prompts: the same text on every request
def count(text: str) -> int:
    """An upper bound of ``text``'s tokens (see the module docstring for the rule)."""
    table = _table()
    words = table["s"], table["a"], table["p"]
    runs, spaced_runs = table["q"], table["r"]
    size = len(text)
    total = 0
    for m in _PIECES.finditer(text):
        piece = m.group()
        start, end = m.span()
        n = len(piece) if piece.isascii() else len(piece.encode("utf-8", "surrogatepass"))
        if n == len(piece) and (end == size or text[end].isascii()) and text[max(start - 2, 0) : start].isascii():
            kind = m.lastgroup
            if kind == "w" and (end == size or text[end] != "'"):
                first = piece[0]
                if first == " ":
                    n = min(n, words[0].get(piece[1:], n))
                elif first.isalpha():
                    if start == 0 or text[start - 1] != "'":  # after a contraction o200k joins them
                        n = min(n, words[1].get(piece, n))
                else:
                    n = min(n, words[2].get(piece[1:], n))
            elif kind == "d":
                n = -(-n // 3)
            elif kind == "p":
                bare = piece.lstrip(" ")
                if (len(bare) == 1 and bare in _PUNCT) or bare in (runs if bare == piece else spaced_runs):
                    n = 1
            elif kind == "s" and piece == piece[0] * n and n <= _SPACES.get(piece[0], 0):
                n = 1
        total += n
    return total


def prompt_tokens(messages: list[dict[str, Any]], schema: dict[str, Any] | None = None) -> int:
    """The prompt tokens of ``messages`` (their contents, each message's overhead, the reply's priming) and of a
    ``response_format`` schema, which the endpoint counts in the prompt (as its compact JSON text)."""
    prompt = sum(PER_MESSAGE + count(_content(m.get("content"))) for m in messages) + PER_REPLY
    if schema is not None:
        prompt += count(json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
    return prompt


def request_tokens(body: dict[str, Any]) -> tuple[int, int]:
    """A chat-completions body's (prompt tokens at most, completion limit): what the request may bill."""
    response_format = body.get("response_format") or {}
    schema = (response_format.get("json_schema") or {}).get("schema") if isinstance(response_format, dict) else None
    limit = int(body.get("max_completion_tokens") or body.get("max_tokens") or 0)
    return prompt_tokens(body.get("messages") or [], schema), limit


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "\n".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)
