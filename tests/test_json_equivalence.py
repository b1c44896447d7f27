"""``judges/_json.py`` writes and reads exactly what the ``json`` module does, or fails as it does.

The request bodies' bytes are what the SDK sent before (``test_wire_golden.py`` compares them with recorded ones);
this covers the edge cases a recorded body does not: every control character, quotes and backslashes, non-BMP
and separator characters, lone surrogates, floats in exponent form, NaN, huge ints, non-str keys, subclasses.
"""

from __future__ import annotations

import enum
import json
from typing import Any

import pytest

from recall_tasks.judges._json import dumps_compact, loads, quote

TEXTS = [
    "",
    "plain",
    'quote " backslash \\ slash /',
    "".join(chr(c) for c in range(0x20)) + "\x7f",
    "unicode é ü 中文 \u2028 \u2029 \ufeff 😀 \U0010ffff",
    "fence </chunk> <\\/chunk>",
    "lone \ud800 surrogate",
]


class Kind(enum.StrEnum):
    A = "a"


class Text(str):
    pass


BODIES: list[Any] = [
    {"model": "m", "messages": [{"role": "system", "content": t} for t in TEXTS[:-1]], "temperature": 0.0},
    {"temperature": 0.2, "top_p": 1.0, "max_tokens": 512, "seed": -3, "stream": False, "stop": None},
    {"x": 1e-05},
    {"x": 1e16},
    {"x": 1.5e300},
    {"x": float("nan")},
    {"x": float("inf")},
    {"x": 2**64},
    {"x": -(2**63) - 1},
    {1: "int key"},
    {"k": Kind.A},
    {"k": Text("sub")},
    {"t": ("a", 1, None, True)},
    {"lone": TEXTS[-1]},
    {"obj": object()},
    {"nested": {"response_format": {"type": "json_schema", "json_schema": {"schema": {"minimum": 1, "x": [0.5]}}}}},
]


def outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except Exception as exc:  # noqa: BLE001 - the type is what is compared
        return "error", type(exc).__name__


@pytest.mark.parametrize("body", BODIES, ids=[str(i) for i in range(len(BODIES))])
def test_bodies_are_the_bytes_the_json_module_writes_or_fail_alike(body):
    def reference(value: Any) -> bytes:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()

    assert outcome(dumps_compact, body) == outcome(reference, body)


@pytest.mark.parametrize("text", [*TEXTS, Text("sub"), Kind.A, None], ids=lambda t: repr(t)[:20])
def test_quoted_strings_are_what_the_json_module_writes(text):
    assert outcome(quote, text) == outcome(lambda t: json.dumps(t, ensure_ascii=False), text)


REPLIES = [
    b'{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":3}}',
    '{"a": "é \\u00e9 \\ud83d\\ude00", "b": [1, 2.5, -0.0, 1e400, true, null]}',
    b'{"a": NaN, "b": Infinity}',
    b'{"big": 123456789012345678901234567890}',
    b'{"dup": 1, "dup": 2}',
    '{"lone": "\\ud800"}',
    '{"a": 1,}',
    b"",
    b"not json",
    '\ufeff{"bom": 1}',
    json.dumps({"utf16": "x"}).encode("utf-16"),
]


@pytest.mark.parametrize("data", REPLIES, ids=[str(i) for i in range(len(REPLIES))])
def test_replies_read_as_the_json_module_reads_them(data):
    ours, reference = outcome(loads, data), outcome(json.loads, data)
    assert ours == reference
    if ours[0] == "ok":
        assert repr(ours[1]) == repr(reference[1])  # -0.0 and inf included


def test_the_judges_schemas_are_checked_once_and_bodies_holding_them_stay_the_same_bytes():
    from recall_tasks.judges import _json, _openai_wire, prompts

    for name, schema in (_openai_wire.VERDICTS, _openai_wire.CLAIMS):
        assert id(schema) in _json._CONSTANTS, name
        body = {
            "model": "m",
            "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}},
        }
        reference = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        assert dumps_compact(body) == reference
    assert prompts.RESPONSE_SCHEMA is _openai_wire.VERDICTS[1]
    exponent = {"x": 1e-05}
    _json.constant(exponent)
    assert id(exponent) not in _json._CONSTANTS  # a value orjson would spell otherwise is never marked
    assert dumps_compact({"k": exponent}) == b'{"k":{"x":1e-05}}'
