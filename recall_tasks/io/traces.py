"""Retrieval context from agent traces: a dataset column holding the agent's run as OpenAI chat messages.

In agent systems retrieval happens in tool calls, so the context the agent saw is the tool results of its run.
The ``messages`` role (default column ``messages``, ``--column messages=NAME``) holds the run, as a list of structs
(``role``, ``content``, ``tool_calls``, ``tool_call_id``, ``name``) or as a JSON string of that list. Two ways to
turn it into ``retrieval_context``, applied per chunk before scoring like a run-time retriever (content hashes,
and so the caches, follow the extracted contexts; the trace itself is not copied to the results):

- ``--context-from tool-results[:NAME,...]``: one chunk per ``role: "tool"`` message, in order; its content is
  taken as text, and a JSON object or array (a structured tool result) is rendered as compact one-line JSON. With
  tool names, only the results of those tools count; a result's tool is the name of the assistant ``tool_calls``
  entry whose ``id`` equals the result's ``tool_call_id`` (else the result's own ``name``). Empty results are dropped.
- ``--context-extractor module:function``: ``function(input, messages) -> list[str]`` (sync or async) for any other
  shape, called once per agent row with the row's question and its parsed messages.

Mastra's rule: a row is agent-shaped when it has messages (a non-empty list); only then is the trace used. A row
without messages (null, empty, ``"[]"``) keeps its static ``retrieval_context`` column, if the dataset has one.
An agent row whose trace yields no chunk has no context and follows ``on_missing``.

Errors stop the run with a :class:`DatasetError` naming file, row (0-based in the file) and column: messages
that are not JSON or not a list of message objects, an extractor that raises or returns anything but a list of
strings. A ``module:function`` that cannot be imported, is not callable or does not take two arguments is a
:class:`ConfigError` before anything is judged.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from recall_tasks._sync import run_sync
from recall_tasks.errors import ConfigError, DatasetError, one_line
from recall_tasks.io.blocks import RowBlock
from recall_tasks.io.retrieval import load_callable, with_contexts

ContextExtractorFn = Callable[[str | None, list[dict[str, Any]]], Any]


def compact(value: Any) -> str:
    """A tool result as text: strings as they are, JSON values as compact one-line JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def render_result(content: Any) -> str:
    """The text of a tool message's ``content`` (a string, JSON text, or OpenAI content parts)."""
    if content is None:
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) and "text" in p for p in content):
        content = "".join(str(p.get("text") or "") for p in content)
    if isinstance(content, str):
        text = content.strip()
        if text[:1] in "{[":
            try:
                return compact(json.loads(text))
            except ValueError:
                pass
        return text
    return compact(content)


def tool_results(messages: list[dict[str, Any]], tools: frozenset[str] | None = None) -> list[str]:
    """One chunk per tool result, in order; with ``tools``, only the results of those tools."""
    names: dict[str, str] = {}
    for m in messages:
        for call in m.get("tool_calls") or []:
            if isinstance(call, dict) and call.get("id"):
                fn = call.get("function") or {}
                names[str(call["id"])] = str((fn.get("name") if isinstance(fn, dict) else None) or call.get("name"))
    out = []
    for m in messages:
        if m.get("role") != "tool":
            continue
        name = names.get(str(m.get("tool_call_id"))) or m.get("name")
        if tools is not None and name not in tools:
            continue
        text = render_result(m.get("content"))
        if text.strip():
            out.append(text)
    return out


def parse_messages(value: Any) -> list[dict[str, Any]] | None:
    """A row's messages (a list of dicts), None when the row has none; ValueError says what is wrong."""
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"messages are not valid JSON ({exc})") from None
    if not isinstance(value, list):
        raise ValueError(f"messages must be a list of chat messages, got {type(value).__name__}")
    if not value:
        return None
    bad = next((i for i, m in enumerate(value) if not isinstance(m, dict)), None)
    if bad is not None:
        raise ValueError(f"message {bad} is a {type(value[bad]).__name__}, not a message object")
    return value


def load_context_extractor(spec: str) -> ContextExtractorFn:
    """Import ``module:function`` and check it takes ``(input, messages)``."""
    fn = load_callable(spec, "--context-extractor")
    try:
        inspect.signature(fn).bind(None, [])
    except TypeError:
        raise ConfigError(f"--context-extractor {spec!r}: the function must take (input, messages)") from None
    except ValueError:  # no signature (a builtin): called as it is
        pass
    return fn


@dataclass(frozen=True)
class TraceContext:
    """How a run takes its contexts from the messages column: tool results (optionally by tool), or a function."""

    column: str  # the dataset's column holding the messages (named in errors)
    tools: frozenset[str] | None = None
    extractor: ContextExtractorFn | None = None
    spec: str = "tool-results"

    @classmethod
    def from_options(cls, context_from: str | None, context_extractor: str | None, column: str) -> TraceContext:
        if context_extractor:
            return cls(column=column, extractor=load_context_extractor(context_extractor), spec=context_extractor)
        mode, _, names = (context_from or "tool-results").partition(":")
        tools = frozenset(n.strip() for n in names.split(",") if n.strip()) if names else None
        return cls(column=column, tools=tools, spec=context_from or mode)

    def context_of(self, question: str | None, messages: list[dict[str, Any]], where: dict[str, Any]) -> list[str]:
        if self.extractor is None:
            return tool_results(messages, self.tools)
        try:
            out = self.extractor(question, messages)
            if inspect.isawaitable(out):
                out = run_sync(_await(out))
        except Exception as exc:  # noqa: BLE001 - the user's function: one clear error naming the row
            detail = one_line(exc, 200, empty="")
            raise DatasetError(
                f"--context-extractor {self.spec} failed: {type(exc).__name__}: {detail}", **where
            ) from None
        if isinstance(out, str) or not isinstance(out, list | tuple) or not all(isinstance(c, str) for c in out):
            raise DatasetError(
                f"--context-extractor {self.spec} must return a list of strings, got {type(out).__name__}", **where
            )
        return list(out)

    def apply(self, block: RowBlock) -> RowBlock:
        """The block with the contexts of its agent rows taken from their traces (others keep theirs)."""
        if "messages" not in block.table.column_names:
            return block
        questions = block.table.column("input").to_pylist()
        static = block.table.column("retrieval_context").to_pylist()
        contexts: list[list[str] | None] = []
        for i, raw in enumerate(block.table.column("messages").to_pylist()):
            uri, row = block.where(i)
            where: dict[str, Any] = {"uri": uri, "row": row, "column": self.column}
            try:
                messages = parse_messages(raw)
            except ValueError as exc:
                raise DatasetError(str(exc), **where) from None
            contexts.append(static[i] if messages is None else self.context_of(questions[i], messages, where))
        out = with_contexts(block, pa.array(contexts, pa.list_(pa.string())))
        table = out.table.drop_columns(["messages"])
        return RowBlock(out.source, out.first_row, out.row_ids, out.content_hashes, table, out.positions, out.same_as)


async def _await(awaitable: Any) -> Any:
    return await awaitable
