"""The OpenAI Batch API's wire format and calls: request lines, splitting, tolerant output parsing, the client.

- A request line is ``{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"}``; the body is
  :meth:`OpenAIJudge.batch_body`, the very body the live judge sends first, so a batch verdict is the verdict
  the live judge would have got (same prompt, schema, temperature, token budget).
- One batch holds at most :data:`MAX_LINES` requests and :data:`MAX_BYTES` of JSONL: :func:`split` cuts there.
- Output lines come in any order and are matched by ``custom_id`` (:func:`parse_output`). A line that is not
  JSON (a truncated file), has no ``custom_id`` or no usable chat completion is reported, never fatal; a
  ``custom_id`` that was never submitted is left to the caller (it warns and ignores it).
- :class:`BatchClient` wraps the SDK's ``files`` and ``batches`` resources; SDK errors are translated as the
  judge translates them, and :meth:`BatchClient.probe` tells an endpoint without a Batch API (404: vLLM, Ollama)
  before anything is uploaded.
- **Idempotent remote steps.** The provider lists files and batches newest first, a page at a time: nothing here
  takes list order for age. An upload is found again by its name, which carries the SHA-256 of its bytes (and by
  its size), so any file of that name holds those bytes. ``POST /batches`` is never retried blindly (the SDK's
  retries are off for it): after a timeout, a dropped connection or a 5xx, the batch is looked up by its
  metadata (:meth:`BatchClient.find_batch`) before another create.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import openai

from recall_tasks.errors import ConfigError

#: Requests per batch and bytes per input file, the Batch API's limits.
MAX_LINES = 50_000
MAX_BYTES = 200 * 1024 * 1024
ENDPOINT: Literal["/v1/chat/completions"] = "/v1/chat/completions"
COMPLETION_WINDOW: Literal["24h"] = "24h"
NO_BATCH_API = "this endpoint has no Batch API; run without --batch"

#: A batch's statuses that will still change.
ACTIVE = frozenset({"validating", "in_progress", "finalizing", "cancelling"})


def request_line(custom_id: str, body: dict[str, Any]) -> bytes:
    """One JSONL line of a batch input file."""
    line = {"custom_id": custom_id, "method": "POST", "url": ENDPOINT, "body": body}
    return (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def split(
    lines: Iterable[tuple[str, bytes]], max_lines: int = MAX_LINES, max_bytes: int = MAX_BYTES
) -> list[list[tuple[str, bytes]]]:
    """Cut ``(custom_id, line)`` pairs into batches of at most ``max_lines`` lines and ``max_bytes`` bytes."""
    parts: list[list[tuple[str, bytes]]] = []
    current: list[tuple[str, bytes]] = []
    size = 0
    for custom_id, line in lines:
        if len(line) > max_bytes:
            raise ConfigError(f"one batch request is {len(line)} bytes, above the batch limit of {max_bytes}")
        if current and (len(current) >= max_lines or size + len(line) > max_bytes):
            parts.append(current)
            current, size = [], 0
        current.append((custom_id, line))
        size += len(line)
    if current:
        parts.append(current)
    return parts


@dataclass
class OutputLine:
    """One answered (or failed) request of a batch's output or error file; ``line`` is 1-based in its file."""

    custom_id: str
    line: int
    content: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None


def parse_output(text: str) -> tuple[dict[str, OutputLine], list[str]]:
    """The lines of an output or error file by ``custom_id``, and the problems of the lines that are unusable.

    Tolerant: blank lines are skipped; a line that is not JSON (a truncated file's last line), has no
    ``custom_id``, or whose response is not a chat completion is a problem (or, with a custom_id, an errored
    line), never an exception. A request answered with an error (``error`` set or a non-200 status) is an
    :class:`OutputLine` with ``error``.
    """
    found: dict[str, OutputLine] = {}
    problems: list[str] = []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except ValueError:  # its number and length, never its text (the file's lines are the endpoint's answers)
            problems.append(f"line {n} is not JSON (a truncated file?): {len(raw.encode('utf-8', 'replace'))} bytes")
            continue
        if not isinstance(item, dict) or not isinstance(item.get("custom_id"), str):
            problems.append(f"line {n} has no custom_id")
            continue
        found[item["custom_id"]] = _line(item, n)
    return found, problems


def _line(item: dict[str, Any], n: int) -> OutputLine:
    out = OutputLine(custom_id=item["custom_id"], line=n)
    error = item.get("error")
    response: dict[str, Any] = item["response"] if isinstance(item.get("response"), dict) else {}
    status = response.get("status_code")
    body = response.get("body")
    if error:
        detail = error.get("message") or error.get("code") if isinstance(error, dict) else error
        code = error.get("code") if isinstance(error, dict) else None
        out.error = f"{code}: {detail}" if code and code != detail else str(detail)
        return out
    if status != 200 or not isinstance(body, dict):
        message = (body.get("error") or {}).get("message") if isinstance(body, dict) else None
        out.error = f"HTTP {status}" + (f": {message}" if message else "")
        return out
    try:
        choice = body["choices"][0]
        out.content = (choice.get("message") or {}).get("content") or ""
        out.finish_reason = choice.get("finish_reason")
        usage = body.get("usage") or {}
        out.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        out.completion_tokens = int(usage.get("completion_tokens") or 0)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError):
        out.error = f"the response is not a chat completion ({_missing(body)})"
    return out


def _missing(body: dict[str, Any]) -> str:
    """What a body that is not a chat completion lacks, in the completion's field names (never the body's text)."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "no choices[0]"
    if not isinstance(choices[0].get("message") or {}, dict):
        return "choices[0].message is not an object"
    return "usage is not token counts"


class BatchClient:
    """The Batch API calls on an ``AsyncOpenAI`` (or Azure) client; errors as the judge translates them."""

    def __init__(self, client: openai.AsyncOpenAI, translate: Callable[[Exception], Exception]) -> None:
        self._client = client
        self._translate = translate

    async def probe(self) -> None:
        """Both routes answer (an empty list is fine); 404 on either: :data:`NO_BATCH_API` (ConfigError)."""
        try:
            await self._client.batches.list(limit=1)
            await self._client.files.list(purpose="batch")
        except openai.NotFoundError:
            raise ConfigError(NO_BATCH_API) from None
        except openai.OpenAIError as exc:
            raise self._translate(exc) from None

    async def upload(self, filename: str, data: bytes) -> str:
        """Upload a batch input file; its file id."""
        try:
            created = await self._client.files.create(file=(filename, data), purpose="batch")
        except openai.OpenAIError as exc:
            raise self._translate(exc) from None
        return str(created.id)

    async def find_upload(self, filename: str, size: int | None = None) -> str | None:
        """The id of an uploaded batch input file named ``filename`` (of ``size`` bytes if given): an upload whose
        id was never recorded. The name carries the content's hash, so any match holds the same bytes; every page
        is read (the listing is newest first, never taken for age)."""
        try:
            async for f in self._client.files.list(purpose="batch"):
                if f.filename == filename and (size is None or f.bytes == size):
                    return str(f.id)
        except openai.OpenAIError as exc:
            raise self._translate(exc) from None
        return None

    async def find_batch(self, metadata: dict[str, str], since: float | None = None) -> dict[str, Any] | None:
        """The batch created with exactly ``metadata`` (newest first, stopping at batches created before
        ``since``, epoch seconds), or None."""
        try:
            async for batch in self._client.batches.list(limit=100):
                if since is not None and batch.created_at < since - 60:
                    break  # newest first: every later one is older than the record
                if batch.metadata and all(batch.metadata.get(k) == v for k, v in metadata.items()):
                    return batch.model_dump(mode="json")
        except openai.OpenAIError as exc:
            raise self._translate(exc) from None
        return None

    async def create(
        self, file_id: str, metadata: dict[str, str], since: float | None = None, attempts: int | None = None
    ) -> dict[str, Any]:
        """Create a batch, never twice: the SDK does not retry ``POST /batches`` itself; after an error that may
        hide a created batch (timeout, dropped connection, 5xx) the batch is looked up by ``metadata`` before the
        next attempt (``attempts``: the client's retries plus one)."""
        tries = attempts if attempts is not None else self._client.max_retries + 1
        once = self._client.with_options(max_retries=0)
        for attempt in range(tries):
            try:
                batch = await once.batches.create(
                    input_file_id=file_id, endpoint=ENDPOINT, completion_window=COMPLETION_WINDOW, metadata=metadata
                )
                return batch.model_dump(mode="json")
            except (openai.APIConnectionError, openai.InternalServerError) as exc:  # timeouts included
                found = await self.find_batch(metadata, since)
                if found is not None:
                    return found
                if attempt + 1 >= tries:
                    raise self._translate(exc) from None
            except openai.OpenAIError as exc:
                raise self._translate(exc) from None
        raise AssertionError("unreachable")

    async def retrieve(self, batch_id: str) -> dict[str, Any]:
        try:
            batch = await self._client.batches.retrieve(batch_id)
        except openai.OpenAIError as exc:
            raise self._translate(exc) from None
        return batch.model_dump(mode="json")

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        try:
            batch = await self._client.batches.cancel(batch_id)
        except openai.OpenAIError as exc:
            raise self._translate(exc) from None
        return batch.model_dump(mode="json")

    async def content(self, file_id: str) -> str:
        try:
            response = await self._client.files.content(file_id)
        except openai.OpenAIError as exc:
            raise self._translate(exc) from None
        return response.text
