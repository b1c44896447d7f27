"""Keep secrets out of messages, logs and reprs.

Every error message recall-bench builds from text it did not write (an exception from a storage
client, an HTTP body from a judge endpoint) goes through :func:`redact` first. Known secrets are:

* the values of the environment variables in :data:`SECRET_ENV_VARS`,
* every value passed to :func:`register_secret` in this process (storage options, API keys),
* the ``extra`` values given to :func:`redact`.

Only values that look like secrets are masked (:func:`secret_like`): one of the known shapes of a key
(``sk-…``, ``AKIA…``, ``ghp_…``, ``xox?-…``, a JWT), or at least :data:`MIN_SECRET_LENGTH` (8) characters
of at least two kinds (lower case, upper case, digits, other) carrying at least :data:`MIN_SECRET_BITS` (24)
bits of Shannon entropy (length x entropy per character of the value's own characters). Local stand-ins
for keys are ordinary words (LocalStack's ``test``, vLLM's ``EMPTY``, MinIO's ``minioadmin``, a
``placeholder``): masking every occurrence of one rewrote the data (``q_test_1`` became ``q_***_1``, every
"EMPTY" in an answer became ``***``) and protected nothing. A value that looks like a secret is masked
wherever it occurs, inside a longer string too: a real key is never a coincidence. :class:`Redactor`
counts what it masked, so a listing can say so.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "MASK",
    "MIN_SECRET_BITS",
    "MIN_SECRET_LENGTH",
    "SECRET_ENV_VARS",
    "Redactor",
    "looks_secret",
    "redact",
    "redact_mapping",
    "redactor",
    "register_secret",
    "secret_like",
]

MASK = "***"
MIN_SECRET_LENGTH = 8
MIN_SECRET_BITS = 24.0
#: Known shapes of keys and tokens (OpenAI-style ``sk-``, AWS access key ids, GitHub, Slack, JWT).
_SHAPES = re.compile(
    r"(?:sk|rk|pk)-[A-Za-z0-9_-]{5,}|(?:AKIA|ASIA|AIDA|AROA)[A-Z0-9]{12,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}|eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"
)
SECRET_ENV_VARS: tuple[str, ...] = (
    "OPENAI_API_KEY",
    "AZURE_OPENAI_API_KEY",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ACCESS_KEY_ID",
)

_SECRET_KEY_RE = re.compile(r"key|secret|token|password|credential", re.IGNORECASE)
_registry: set[str] = set()
_lock = threading.Lock()


def secret_like(value: str) -> bool:
    """Whether ``value`` looks like a secret, so that masking it never rewrites ordinary text (module docstring)."""
    if len(value) < MIN_SECRET_LENGTH:
        return False
    if _SHAPES.fullmatch(value):
        return True
    kinds = (
        any(c.islower() for c in value) + any(c.isupper() for c in value) + any(c.isdigit() for c in value)
        + any(not c.isalnum() for c in value)
    )  # fmt: skip
    if kinds < 2:
        return False
    n = len(value)
    bits = -sum(k * math.log2(k / n) for k in Counter(value).values())  # n x the entropy per character
    return bits >= MIN_SECRET_BITS


def register_secret(value: str | None) -> None:
    """Remember ``value`` for the rest of the process so that :func:`redact` masks it.

    ``None``, empty values and values that do not look like secrets are ignored, so callers can register
    unconditionally.
    """
    if value and secret_like(value):
        with _lock:
            _registry.add(value)


def looks_secret(key: str) -> bool:
    """Whether an option or field named ``key`` holds a secret (key/secret/token/password/credential)."""
    return bool(_SECRET_KEY_RE.search(key))


def _known_secrets(extra: Iterable[str]) -> list[str]:
    # live, not settings: mask what the environment holds as the message is built, even if settings fail to load
    values = {os.environ.get(name, "") for name in SECRET_ENV_VARS}
    with _lock:
        values |= _registry
    values |= {v for v in extra if v}
    # Longest first, so that a secret containing another one is masked as a whole.
    return sorted((v for v in values if secret_like(v)), key=len, reverse=True)


def redact(text: str, extra: Iterable[str] = ()) -> str:
    """Return ``text`` with every known secret (see the module docstring) replaced by ``"***"``."""
    for secret in _known_secrets(extra):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


class Redactor:
    """:func:`redact` with the secrets known now looked up once (for many values: a query's rows); ``masked``
    counts the values it changed, so the listing can say that something was redacted."""

    def __init__(self, extra: Iterable[str] = ()) -> None:
        self.secrets = _known_secrets(extra)
        self.masked = 0

    def __call__(self, text: str) -> str:
        changed = False
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
                changed = True
        self.masked += changed
        return text


def redactor(extra: Iterable[str] = ()) -> Redactor:
    """A :class:`Redactor` of the secrets known now."""
    return Redactor(extra)


def redact_mapping(d: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of ``d`` whose secret-looking keys (see :func:`looks_secret`) map to ``"***"``.

    Nested mappings (e.g. s3fs ``client_kwargs``) are redacted the same way; other values are kept.
    """
    out: dict[str, Any] = {}
    for key, value in d.items():
        if looks_secret(str(key)):
            out[key] = MASK
        elif isinstance(value, Mapping):
            out[key] = redact_mapping(value)
        else:
            out[key] = value
    return out
