"""A judge request against its model's context window: counted before sending, refused, cut or sent as is.

An endpoint answers a request whose prompt plus completion budget exceeds the model's window with
``400 context_length_exceeded`` after the row was queued, rate-limited and sent; a proxy may answer ``413``. The
judge counts first (:func:`tokens_needed`) and follows ``--on-overlong`` (:data:`POLICIES`):

- ``refuse`` (the default): the row's error (:class:`~recall_tasks.errors.ContextOverflowError`), no request;
- ``truncate``: the context is cut from its end (the last-ranked chunks first, the chunk where the cut falls
  keeps its beginning) until the request fits; the row's flags say how much was kept. The number of chunks
  stays the same (a cut chunk reads ``[cut]``), so chunk ids still name the retrieved chunks;
- ``send``: sent as is (the endpoint decides; its rejection is the row's error).

The window: ``--context-window N``, else :data:`CONTEXT_WINDOWS` by model name (a dated snapshot takes its
family's window), else unknown: nothing is counted and every request is sent.

The count is :mod:`~recall_tasks.judges.tokens`' estimate, the one every user of a request's tokens takes (the
dry run, ``--tpm``, the cost reservation, the ``--batch`` admission): an upper bound of what the tokenizer counts,
so a request the check lets through fits, and one near the window may be refused although the endpoint would
take it. A request fits when its count equals the window exactly.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from recall_tasks.errors import ContextOverflowError
from recall_tasks.judges.base import JudgeRequest
from recall_tasks.judges.tokens import PER_MESSAGE, PER_REPLY, count, prompt_tokens

#: ``--on-overlong`` values.
POLICIES = ("refuse", "truncate", "send")

#: Context windows (prompt plus completion tokens) of known models, by name; a dated snapshot
#: (``gpt-4o-mini-2024-07-18``) takes the longest known prefix's.
CONTEXT_WINDOWS: dict[str, int] = {
    "gpt-4o-mini": 128_000,
    "gpt-4o": 128_000,
    "gpt-4-turbo": 128_000,
    "gpt-4": 8_192,
    "gpt-4-32k": 32_768,
    "gpt-3.5-turbo": 16_385,
    "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 1_047_576,
    "gpt-4.1-nano": 1_047_576,
    "gpt-5": 400_000,
    "gpt-5-mini": 400_000,
    "gpt-5-nano": 400_000,
    "o1": 200_000,
    "o1-mini": 128_000,
    "o3": 200_000,
    "o3-mini": 200_000,
    "o4-mini": 200_000,
}

#: What stands for a chunk cut away entirely, and what ends a chunk cut short.
CUT = "[cut]"


def window_for(model: str, override: int | None = None) -> int | None:
    """The context window of ``model``: ``override`` (``--context-window``), else :data:`CONTEXT_WINDOWS` (exact
    name, then the longest known prefix), else None (unknown: not checked)."""
    if override is not None:
        return override
    if model in CONTEXT_WINDOWS:
        return CONTEXT_WINDOWS[model]
    best = max((name for name in CONTEXT_WINDOWS if model.startswith(name + "-")), key=len, default=None)
    return CONTEXT_WINDOWS[best] if best else None


def tokens_needed(msgs: list[dict[str, str]], budget: int, schema: dict[str, Any] | None = None) -> int:
    """Prompt tokens of ``msgs`` (and of a ``response_format`` schema, which the endpoint counts in the prompt),
    plus ``budget``, the completion tokens asked for: what must fit the window (:func:`tokens.prompt_tokens
    <recall_tasks.judges.tokens.prompt_tokens>`)."""
    return prompt_tokens(msgs, schema) + budget


def tokens_at_most(msgs: list[dict[str, str]], budget: int, schema: dict[str, Any] | None = None) -> int:
    """An upper bound of :func:`tokens_needed` that counts nothing: each piece the estimate counts is at most its
    UTF-8 bytes, so a text's estimate is at most its length in bytes (one encode, in C)."""
    prompt = sum(PER_MESSAGE + _utf8_len(m["content"]) for m in msgs) + PER_REPLY
    if schema is not None:
        prompt += _utf8_len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
    return prompt + budget


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def fit(
    request: JudgeRequest,
    need: Callable[[JudgeRequest], int],
    window: int,
    policy: str,
    model: str,
    at_most: Callable[[JudgeRequest], int] | None = None,
) -> tuple[JudgeRequest, str | None]:
    """``request`` as it may be sent under ``policy``, and the flag of a cut context (None when it fits as is).

    ``need(request)``: the tokens the request needs (:func:`tokens_needed` of its messages, budget and schema).
    ``at_most(request)``: an upper bound of it (:func:`tokens_at_most`); a request whose bound fits is not counted.
    The count costs ~0.3 ms of CPU for a 3 KB prompt, about half of a judged row's client CPU, while the
    bound is an encode; a request is counted only when its bytes come near the window.
    Raises :class:`ContextOverflowError` (``refuse``, or a request that does not fit with its whole context cut).
    """
    if policy == "send" or (at_most is not None and at_most(request) <= window):
        return request, None
    needed = need(request)
    if needed <= window:
        return request, None
    what = f"the prompt and its reply budget need about {needed} tokens, over {model}'s context window of {window}"
    if policy == "refuse":
        raise ContextOverflowError(
            f"{what}: not sent (--on-overlong refuse; --on-overlong truncate cuts the context to fit, "
            "--context-window N sets the window)",
            model=model,
        )
    field = "evidence" if request.task == "contextual_recall" else "statements"
    chunks = list(getattr(request, field))
    before = sum(count(c) for c in chunks)
    candidate = request
    for _ in range(8):  # each pass removes the estimated excess; the rendering's own tokens may need another
        excess = need(candidate) - window
        if excess <= 0:
            break
        chunks = _cut(chunks, excess)
        candidate = request.model_copy(update={field: chunks})
        if all(c == CUT for c in chunks) and need(candidate) > window:
            break
    if need(candidate) > window:
        raise ContextOverflowError(
            f"{what}, and about {need(candidate)} with its whole context cut (--on-overlong truncate): not sent",
            model=model,
        )
    kept = sum(count(c.removesuffix(" " + CUT)) for c in chunks if c != CUT)
    return candidate, (
        f"context cut to fit {model}'s context window of {window} tokens (--on-overlong truncate): about "
        f"{max(kept, 0)} of {before} context tokens kept"
    )


def _cut(chunks: list[str], excess: int) -> list[str]:
    """``chunks`` with about ``excess`` tokens removed from the end: whole chunks, then the end of one."""
    out = list(chunks)
    for i in range(len(out) - 1, -1, -1):
        if excess <= 0:
            break
        if out[i] == CUT:
            continue
        tokens = count(out[i])
        if tokens - count(CUT) <= excess:
            excess -= tokens - count(CUT)
            out[i] = CUT
            continue
        target = tokens - excess - count(" " + CUT)
        text = out[i]
        lo, hi = 0, len(text)  # the longest prefix within target tokens (the count grows with the prefix)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if count(text[:mid]) <= target:
                lo = mid
            else:
                hi = mid - 1
        out[i] = text[:lo] + " " + CUT if lo else CUT
        excess = 0
    return out
