"""Retrieval at run time: fill ``retrieval_context`` from a new index instead of the dataset.

Two ways, both applied per chunk before scoring (the row id stays the dataset's; content hashes, and so the
caches, follow the new contexts):
- ``--retriever module:function``: ``function(questions: list[str]) -> list[list[str]]`` (sync or async),
  called once per chunk with the chunk's questions, in order. It runs in the chunk's worker thread (sync) or
  on the judge loop (async). Each answer may also be ``{"contexts": [...], "ids": [...]}``: the retrieved
  document ids, in rank order, for the id metrics (``retrieved_context_ids``).
- ``--retrieval-uri``: a Parquet dataset of ``row_id`` + ``retrieval_context`` (list<string>; ragas/deepeval
  names accepted) and/or ``retrieved_context_ids`` written by the index build, joined by row id. It is held in
  memory as Arrow for the run (~1 KB per row for 5 chunks); rows it lacks get no context and follow
  ``on_missing``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import replace
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
IDS = "retrieved_context_ids"


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
    return retrieve_with_ids(fn, questions)[0]


def retrieve_with_ids(fn: Retriever, questions: list[str]) -> tuple[list[list[str]], list[Any] | None]:
    """Call the retriever for one batch: the contexts, and the ids when its answers are ``{contexts, ids}``."""
    out = fn(questions)
    if inspect.isawaitable(out):
        out = run_sync(_await(out))
    answers = list(out)
    if len(answers) != len(questions):
        raise ConfigError(f"retriever returned {len(answers)} contexts for {len(questions)} questions")
    contexts, ids = [], []
    for i, answer in enumerate(answers):
        ctx, found = (answer.get("contexts"), answer.get("ids")) if isinstance(answer, dict) else (answer, None)
        if ctx is None and found is not None:
            ctx = []
        if ctx is None or isinstance(ctx, str) or not all(isinstance(c, str) for c in ctx):
            raise ConfigError(f"retriever result {i} must be a list of strings (or {{contexts, ids}})")
        if found is not None and (isinstance(found, str | bytes) or not isinstance(found, list | tuple)):
            raise ConfigError(f"retriever result {i}: ids must be a list of string or integer ids")
        contexts.append(list(ctx))
        ids.append(None if found is None else list(found))
    return contexts, (ids if any(i is not None for i in ids) else None)


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
        self.uri = uri
        column = next((c for c in DEFAULT_NAMES["retrieval_context"] if c in table.column_names), None)
        ids = IDS if IDS in table.column_names else None
        if "row_id" not in table.column_names or (column is None and ids is None):
            raise DatasetError(
                f"retrieval results need row_id and one of {', '.join(DEFAULT_NAMES['retrieval_context'])} "
                f"(or {IDS}); found {', '.join(table.column_names)}", uri=uri,
            )  # fmt: skip
        self.row_ids = table.column("row_id").cast(pa.string())
        #: the retrieved document ids as stored (normalised by pipeline/ids_step.py), None without the column
        self.ids: pa.ChunkedArray | None = table.column(ids) if ids is not None else None
        self.contexts: pa.ChunkedArray | None = None
        if column is None:
            return
        try:
            self.contexts = table.column(column).cast(_CONTEXT)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise DatasetError(
                f"expected list<string>, found {table.schema.field(column).type}", uri=uri, column=column
            ) from None

    def _take(self, values: pa.ChunkedArray, row_ids: list[str]) -> pa.Array:
        idx = pc.index_in(pa.array(row_ids, pa.string()), value_set=self.row_ids.combine_chunks())
        return values.combine_chunks().take(idx)

    def contexts_for(self, row_ids: list[str]) -> pa.Array | None:
        return None if self.contexts is None else self._take(self.contexts, row_ids)

    def ids_for(self, row_ids: list[str]) -> pa.Array | None:
        """Each row's retrieved ids as stored (null for a row the file lacks), None when the file has no ids."""
        return None if self.ids is None else self._take(self.ids, row_ids)

    def apply(self, block: RowBlock) -> RowBlock:
        """The block with the file's contexts (if it has them) and retrieved ids (if it has them)."""
        contexts = self.contexts_for(block.row_ids)
        block = block if contexts is None else with_contexts(block, contexts)
        ids = self.ids_for(block.row_ids)
        return block if ids is None else with_column(block, IDS, ids)


def with_column(block: RowBlock, name: str, values: pa.Array) -> RowBlock:
    """The block with column ``name`` set (replaced or added); not a judged column, so the hashes stay."""
    table = block.table
    if name in table.column_names:
        table = table.set_column(table.column_names.index(name), name, values)
    else:
        table = table.append_column(name, values)
    return replace(block, table=table)


def with_retrieved(block: RowBlock, fn: Retriever) -> RowBlock:
    """The block with the retriever's contexts and, when it returns them, its retrieved ids."""
    questions = [q or "" for q in block.table.column("input").to_pylist()]
    contexts, ids = retrieve_with_ids(fn, questions)
    block = with_contexts(block, contexts)
    if ids is None:
        return block
    try:  # as returned: string or integer ids (a float or a null id is refused by pipeline/ids_step.py)
        values = pa.array(ids)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
        raise ConfigError(f"--retriever: ids must be lists of string or integer ids ({exc})") from None
    return with_column(block, IDS, values)


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
