"""Keep secrets out of messages, logs and reprs.

Every error message recall-bench builds from text it did not write (an exception from a storage
client, an HTTP body from a judge endpoint) goes through :func:`redact` first. Known secrets are:

* the values of the environment variables in :data:`SECRET_ENV_VARS`,
* every value passed to :func:`register_secret` in this process (storage options, API keys),
* the ``extra`` values given to :func:`redact`.

Values shorter than :data:`MIN_SECRET_LENGTH` characters are never treated as secrets: replacing
"1" or "us" everywhere would destroy messages and protect nothing.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = [
    "MASK",
    "MIN_SECRET_LENGTH",
    "SECRET_ENV_VARS",
    "looks_secret",
    "redact",
    "redact_mapping",
    "redactor",
    "register_secret",
]

MASK = "***"
MIN_SECRET_LENGTH = 4
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


def register_secret(value: str | None) -> None:
    """Remember ``value`` for the rest of the process so that :func:`redact` masks it.

    ``None``, empty and too-short values are ignored, so callers can register unconditionally.
    """
    if value and len(value) >= MIN_SECRET_LENGTH:
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
    return sorted((v for v in values if len(v) >= MIN_SECRET_LENGTH), key=len, reverse=True)


def redact(text: str, extra: Iterable[str] = ()) -> str:
    """Return ``text`` with every known secret (see the module docstring) replaced by ``"***"``."""
    for secret in _known_secrets(extra):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def redactor(extra: Iterable[str] = ()) -> Callable[[str], str]:
    """:func:`redact` with the secrets known now looked up once: for masking many values (a query's rows)."""
    secrets = _known_secrets(extra)

    def apply(text: str) -> str:
        for secret in secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    return apply


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
