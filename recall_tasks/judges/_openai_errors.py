"""The OpenAI judge's errors: SDK errors mapped to recall-bench's typed errors, with a text that says what to fix.

Split from :mod:`recall_tasks.judges._openai_http` (the clients). The endpoint is named by host and port only,
and every text is redacted of the API key.
"""

from __future__ import annotations

import json
import re

import httpx2
import openai

from recall_tasks.errors import JudgeConfigError, JudgeRejectedError, JudgeTransientError
from recall_tasks.judges._openai_attempts import INSUFFICIENT_QUOTA
from recall_tasks.judges._openai_reply import ReplyTooLargeError, _chain, describe_failure
from recall_tasks.secrets import redact


def check_key(key: str, model: str, azure: bool) -> None:
    """Refuse a key with a control character (a line break from ``echo`` into a secret file, a CR/LF): sent in a
    header it would be refused by the SDK on every request, or split the request on a less careful client."""
    bad = next((i for i, c in enumerate(key) if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is None:
        return
    where = "at its end" if bad == len(key) - 1 else f"at character {bad + 1} of {len(key)}"
    name = "AZURE_OPENAI_API_KEY" if azure else "OPENAI_API_KEY"
    raise JudgeConfigError(
        f"the API key for the OpenAI judge holds a control character {where} (a line break from `echo` into a "
        f"secret file?): set {name} to the key alone",
        model=model,
    )


def translate_error(
    exc: Exception, endpoint: str, model: str, api_key: str, max_retries: int, timeout_s: float
) -> Exception:
    """Map SDK errors to recall-bench's typed errors with a message that says what to fix."""
    where = endpoint
    text = redact(_error_text(exc), extra=[api_key] if api_key else ())
    status = getattr(exc, "status_code", None)
    if isinstance(exc, openai.AuthenticationError):
        return JudgeConfigError(
            f"{where} rejected the API key (401): set OPENAI_API_KEY (AZURE_OPENAI_API_KEY for Azure) to a "
            f"valid key for this endpoint. {text}",
            model=model,
            status=401,
        )
    if isinstance(exc, openai.PermissionDeniedError):
        return JudgeConfigError(f"{where} denied access to model {model} (403): {text}", model=model, status=403)
    if isinstance(exc, openai.NotFoundError):
        return JudgeConfigError(
            f"{where} does not serve model {model!r} (404): check --model and --base-url. {text}",
            model=model,
            status=404,
        )
    if isinstance(exc, openai.RateLimitError):
        if INSUFFICIENT_QUOTA in text:
            return JudgeConfigError(
                f"{where}: quota exhausted (insufficient_quota); add credit or use another key. {text}",
                model=model,
                status=429,
            )
        return JudgeTransientError(
            f"{where} kept rate-limiting (429) after {max_retries} retries; lower --max-concurrency "
            f"or set requests_per_minute. {text}",
            model=model,
            status=429,
        )
    if isinstance(exc, openai.APIConnectionError):  # APITimeoutError included: the chain says what happened
        cause, timed_out = describe_failure(exc, timeout_s)
        cause = redact(cause, extra=[api_key] if api_key else ())
        if timed_out or any(isinstance(e, ReplyTooLargeError | httpx2.RemoteProtocolError) for e in _chain(exc)):
            return JudgeTransientError(f"{where}: {cause} ({max_retries} retries)", model=model)
        return JudgeTransientError(f"cannot connect to {where}: {cause} ({max_retries} retries)", model=model)
    if isinstance(exc, openai.APIStatusError) and status is not None and status >= 500:
        return JudgeTransientError(
            f"{where} failed with {status} after {max_retries} retries: {text}",
            model=model,
            status=status,
        )
    if isinstance(exc, openai.APIStatusError):  # 400, 413, 422...: this request's, not the run's (the breaker decides)
        return JudgeRejectedError(f"{where} rejected the request ({status}): {text}", model=model, status=status)
    return JudgeTransientError(f"judge call failed: {text}", model=model)


_TITLE = re.compile(r"<title>(.*?)</title>", re.I | re.S)


def _error_text(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            parts = [str(error.get(k)) for k in ("message", "code", "param") if error.get(k)]
            return "; ".join(parts) or json.dumps(error)[:300]
    if isinstance(body, str) and body.strip():  # a proxy's page (nginx's 413): its title, else its first words
        title = _TITLE.search(body)
        return " ".join((title.group(1) if title else re.sub(r"<[^>]*>", " ", body)).split())[:300]
    return str(getattr(exc, "message", None) or exc)[:300]
