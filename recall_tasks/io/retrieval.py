"""Retrieval at run time: fill ``retrieval_context`` from a new index instead of the dataset.

Two ways, both applied per chunk before scoring (the row id stays the dataset's; content hashes, and so the
caches, follow the new contexts):
- ``--retriever module:function``: ``function(questions: list[str]) -> list[list[str]]`` (sync or async),
  called once per chunk with the chunk's questions, in order. It runs in the chunk's worker thread (sync) or
  on the judge loop (async).
- ``--retrieval-uri``: a Parquet dataset of ``row_id`` + ``retrieval_context`` (list<string>; ragas/deepeval
  names accepted) written by the index build, joined by row id. It is held in memory as Arrow for the run
  (~1 KB per row for 5 chunks); rows it lacks get no context and follow ``on_missing``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recall_tasks._sync import run_sync
from recall_tasks.errors import ConfigError, DatasetError
from recall_tasks.io.blocks import RowBlock, content_hash
from recall_tasks.io.columns import DEFAULT_NAMES, JUDGED_ROLES
from recall_tasks.io.storage import StorageConfig, filesystem, translate_storage_error

Retriever = Callable[[list[str]], Any]
_CONTEXT = pa.list_(pa.string())


def load_callable(spec: str, option: str) -> Callable[..., Any]:
    """Import ``module:function`` given to ``option``; a clear error when it cannot be found or called."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{option} {spec!r}: expected module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{option} {spec!r}: cannot import {module_name!r} ({exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{option} {spec!r}: {module_name} has no callable {attr!r}")
    return cast(Callable[..., Any], fn)


def load_retriever(spec: str) -> Retriever:
    """Import the ``--retriever`` ``module:function``."""
    return load_callable(spec, "--retriever")


def retrieve(fn: Retriever, questions: list[str]) -> list[list[str]]:
    """Call the retriever for one batch and check its answer's shape."""
    out = fn(questions)
    if inspect.isawaitable(out):
        out = run_sync(_await(out))
    contexts = list(out)
    if len(contexts) != len(questions):
        raise ConfigError(f"retriever returned {len(contexts)} contexts for {len(questions)} questions")
    for i, ctx in enumerate(contexts):
        if isinstance(ctx, str) or not all(isinstance(c, str) for c in ctx):
            raise ConfigError(f"retriever result {i} must be a list of strings")
    return [list(c) for c in contexts]


async def _await(awaitable: Any) -> Any:
    return await awaitable


class RetrievalResults:
    """Contexts from a new index's retrieval results, looked up by row id."""

    def __init__(self, uri: str, storage: StorageConfig) -> None:
        fs, path = filesystem(uri, storage)
        try:
            table = pq.read_table(path, filesystem=fs)
        except FileNotFoundError:
            raise translate_storage_error(FileNotFoundError(uri), uri) from None
        except (pa.ArrowInvalid, OSError) as exc:
            raise DatasetError(f"retrieval results are not readable Parquet: {exc}", uri=uri) from None
        column = next((c for c in DEFAULT_NAMES["retrieval_context"] if c in table.column_names), None)
        if "row_id" not in table.column_names or column is None:
            raise DatasetError(
                f"retrieval results need row_id and one of {', '.join(DEFAULT_NAMES['retrieval_context'])}; "
                f"found {', '.join(table.column_names)}", uri=uri,
            )  # fmt: skip
        self.row_ids = table.column("row_id").cast(pa.string())
        try:
            self.contexts = table.column(column).cast(_CONTEXT)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise DatasetError(
                f"expected list<string>, found {table.schema.field(column).type}", uri=uri, column=column
            ) from None

    def contexts_for(self, row_ids: list[str]) -> pa.Array:
        idx = pc.index_in(pa.array(row_ids, pa.string()), value_set=self.row_ids.combine_chunks())
        return self.contexts.combine_chunks().take(idx)


def with_contexts(block: RowBlock, contexts: pa.Array | list[list[str]]) -> RowBlock:
    """The block with its retrieval_context replaced (row ids kept, content hashes recomputed)."""
    array = contexts if isinstance(contexts, pa.Array) else pa.array(contexts, _CONTEXT)
    table = block.table.set_column(block.table.column_names.index("retrieval_context"), "retrieval_context", array)
    columns = [table.column(c).to_pylist() for c in JUDGED_ROLES]
    hashes = [content_hash(row) for row in zip(*columns, strict=True)]
    return RowBlock(
        source=block.source, first_row=block.first_row, row_ids=block.row_ids, content_hashes=hashes, table=table,
        positions=block.positions, same_as=block.same_as,
    )  # fmt: skip
