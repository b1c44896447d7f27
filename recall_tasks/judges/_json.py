"""JSON on the judge's hot path: orjson where it writes and reads exactly what the ``json`` module does.

A judged row serialises its request body (~4 KB), quotes each sentence of its prompt, and parses the reply twice
(the chat completion, then its content); with the stdlib that was ~20 % of a row's client CPU. orjson gives the
same bytes and the same objects for everything the judge sends and receives, with these exceptions, which go to
the ``json`` module instead (so a value it refuses still fails as it did):

- **writing**: floats in exponent form (Python writes ``1e-05``, orjson ``1e-5``), NaN and infinities (orjson
  writes ``null`` where the SDK's ``allow_nan=False`` refuses), ints beyond 64 bits, non-str keys, lone
  surrogates, and any type but plain ``dict``/``list``/``tuple``/``str``/``int``/``float``/``bool``/``None``;
- **reading**: anything orjson refuses (NaN literals, other encodings than UTF-8, invalid JSON: the ``json``
  module then parses it or raises its own error, with its message), and text with 19 digits in a row (an int
  beyond 64 bits, which orjson would read as a float).

``tests/test_wire_golden.py`` compares request bodies with bytes recorded before this module existed, and
``tests/test_json_equivalence.py`` compares both libraries on the edge cases above.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

_COMPACT = {"ensure_ascii": False, "separators": (",", ":"), "allow_nan": False}

#: constants checked once (:func:`constant`) by id, held here so that no other object can take their id
_CONSTANTS: dict[int, Any] = {}


def constant(value: Any) -> Any:
    """Mark a module constant that is never mutated (the judge's JSON schemas) as checked: bodies holding it are
    not walked into it again (walking the verdict schema was most of :func:`dumps_compact`'s time)."""
    if _plain(value):
        _CONSTANTS[id(value)] = value
    return value


def _plain(value: Any) -> bool:
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if id(value) in _CONSTANTS:
        return True
    if kind is float:
        text = repr(value)
        return "e" not in text and "n" not in text  # exponent form, nan, inf
    if kind is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if kind is list or kind is tuple:
        return all(_plain(v) for v in value)
    return False


def dumps_compact(value: Any) -> bytes:
    """``json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()``, faster."""
    if _plain(value):
        try:
            return orjson.dumps(value)
        except orjson.JSONEncodeError:  # ints beyond 64 bits, lone surrogates: the json module says what is wrong
            pass
    return json.dumps(value, **_COMPACT).encode()  # type: ignore[arg-type]


def quote(text: str) -> str:
    """``json.dumps(text, ensure_ascii=False)`` for a string, faster."""
    if type(text) is str:
        try:
            return orjson.dumps(text).decode()
        except orjson.JSONEncodeError:
            pass
    return json.dumps(text, ensure_ascii=False)


#: 19 digits in a row: maybe an int beyond 64 bits, which orjson reads as a float (the json module: an int)
_LONG_DIGITS_B = re.compile(rb"\d{19}")
_LONG_DIGITS_S = re.compile(r"\d{19}")


def loads(data: bytes | str) -> Any:
    """``json.loads(data)``, faster: orjson first, the json module for whatever orjson refuses or reads otherwise."""
    long_digits = _LONG_DIGITS_B if isinstance(data, bytes) else _LONG_DIGITS_S
    if isinstance(data, bytes | str) and long_digits.search(data) is None:  # type: ignore[arg-type]
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)
