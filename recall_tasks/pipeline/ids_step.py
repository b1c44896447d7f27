"""The id-based retrieval metrics in a run (issue 41): where the ids come from, their checks, the per-row values.

- **Sources.** Retrieved ids (rank order): the dataset's ``retrieved_context_ids`` column, a ``--retrieval-uri``
  file's, or a ``--retriever``'s ``{contexts, ids}`` answers. Relevant ids: the ``reference_context_ids`` column
  (with ``reference_context_relevance`` for graded nDCG), or ``--qrels`` joined by row id. ``--id-pattern`` maps a
  chunk id to its document id first. Ids compare as strings.
- **When.** Always in a ``retrieval_ids`` run (which needs both sides: refused otherwise); in a judged run whenever
  both sides are there, at no extra request (the judge never sees the ids).
- **Checks, before any write** (:func:`check_ids`): ``--k``, ``--verdict-metric``, the qrels (their coverage by
  ``--retrieval-uri``'s rule: refused when they judge none of the row ids, or when under ``--on-missing error``
  the rows they lack exceed ``--max-error-rate``; else a note with the count), and every id value of the dataset
  and retrieval file (:func:`scan`): a null id, a list holding nulls, a float id or a negative relevance is one
  ``error:`` line naming the file, row and column.
- **Per row** (:func:`with_id_metrics`): the ``id_metrics`` map column (``"recall@10" -> 0.8``; null when the row
  is not assessed: no relevant ids) and the normalised id columns replace the ones read. A ``retrieval_ids``
  run's chunk is built here whole (:func:`score_ids_block`): ``score`` is the ``--verdict-metric`` value,
  ``success`` whether a relevant document is in its top k, no judge, no request.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError, RecallBenchError
from recall_tasks.id_params import IdPattern, compile_id_pattern
from recall_tasks.io.blocks import RowBlock, iter_row_ids
from recall_tasks.io.columns import ID_ROLES
from recall_tasks.io.datasets import Dataset
from recall_tasks.io.retrieval import IDS, RetrievalResults
from recall_tasks.io.schemas import CHUNK_FIELDS, ID_METRICS_FIELD, passthrough_name
from recall_tasks.io.storage import StorageConfig
from recall_tasks.io.textfiles import open_parquet
from recall_tasks.metrics.ids_compute import id_metrics, normalise_ids, normalise_relevance, parse_ks
from recall_tasks.metrics.retrieval_ids import IDS_VERSION, NO_JUDGE

RETRIEVED, RELEVANT, RELEVANCE = ID_ROLES
NOT_ASSESSED = "not assessed: no relevant document ids (reference_context_ids empty or absent)"
#: The reason when the relevant ids come from ``--qrels`` (``{}``: its URI)
NOT_IN_QRELS = "not assessed: no relevant document ids for this row id in --qrels {}"
NO_RETRIEVED = "not assessed: no retrieved ids for this row (--retrieval-uri lacks it, or the retriever gave none)"
_IDS = pa.list_(pa.string())


@dataclass(frozen=True)
class IdSetup:
    """What a run's id metrics need: cut-offs, the chunk-to-document pattern, the qrels, the verdict metric."""

    ks: tuple[int, ...]
    pattern: IdPattern | None  # --id-pattern, checked (RE2: matched in linear time)
    verdict: str
    qrels: Any = None  # io/qrels.py's table of relevant ids by row id
    columns: tuple[tuple[str, str], ...] = ()  # (role, dataset column) of the id roles the dataset has
    note: str | None = None  # the checks' note: the qrels lack some rows (:func:`check_ids`)

    def column(self, role: str) -> str:
        return dict(self.columns).get(role, role)

    def mapping(self, role: str) -> IdPattern | None:
        """``--id-pattern`` maps retrieved chunk ids; the relevant ids are document ids already."""
        return self.pattern if role == RETRIEVED else None


#: Setups checked by :func:`check_ids`, by the run's parameters (``plan`` reads them back: :func:`setup_of`).
_CHECKED: dict[str, IdSetup | None] = {}


def _ks(params: RunParams) -> tuple[int, ...]:
    try:
        return tuple(parse_ks(params.k))
    except RecallBenchError:
        raise
    except ValueError as exc:
        raise ConfigError(f"--k {params.k!r}: {exc}") from None


def build_setup(
    params: RunParams, dataset: Dataset, storage: StorageConfig, retrieval: RetrievalResults | None, retriever: bool
) -> IdSetup | None:
    """The run's id setup (None: no id metrics in this run), or one ConfigError naming what is missing."""
    ks = _ks(params)
    has_retrieved = RETRIEVED in dataset.columns or (retrieval is not None and retrieval.ids is not None) or retriever
    has_relevant = RELEVANT in dataset.columns or params.qrels_uri is not None
    ids_run = params.metric == "retrieval_ids"
    if ids_run or params.qrels_uri:
        if not has_relevant:
            raise ConfigError(
                "--metric retrieval_ids needs the relevant document ids: a reference_context_ids column (or --column "
                "reference_context_ids=NAME) or --qrels URI"
            )
        if not has_retrieved:
            raise ConfigError(
                f"{'--metric retrieval_ids' if ids_run else '--qrels'} needs the retrieved document ids: a "
                "retrieved_context_ids column (or --column retrieved_context_ids=NAME), a --retrieval-uri file "
                "with retrieved_context_ids, or a --retriever returning {contexts, ids}"
            )
    if not (has_relevant and has_retrieved):
        return None
    if ids_run and int(params.verdict_metric.rpartition("@")[2]) not in ks:
        raise ConfigError(f"--verdict-metric {params.verdict_metric}: its k is not one of --k {params.k}")
    qrels = None
    if params.qrels_uri is not None:
        from recall_tasks.io.qrels import read_qrels

        qrels = read_qrels(params.qrels_uri, storage)
    try:
        pattern = compile_id_pattern(params.id_pattern) if params.id_pattern else None
    except ValueError as exc:  # RunParams checked it already: a model built without validation
        raise ConfigError(str(exc)) from None
    columns = tuple((role, dataset.columns[role]) for role in ID_ROLES if role in dataset.columns)
    return IdSetup(ks, pattern, params.verdict_metric, qrels, columns)


def check_ids(
    params: RunParams, dataset: Dataset, storage: StorageConfig, retrieval: RetrievalResults | None, retriever: bool
) -> IdSetup | None:
    """Every check of the id metrics, before any write: the setup, the qrels' row ids, every id value."""
    setup = build_setup(params, dataset, storage, retrieval, retriever)
    if setup is not None:
        if setup.qrels is not None:
            setup = replace(setup, note=_check_qrels_rows(params, dataset, setup))
        scan(dataset, setup, retrieval)
    _CHECKED[params.model_dump_json()] = setup
    return setup


def setup_of(plan: Any) -> IdSetup | None:
    """The plan's id setup: the one checked in this process, else built again (a worker process: no scan)."""
    key = plan.params.model_dump_json()
    if key not in _CHECKED:
        storage = StorageConfig.from_options(plan.params.storage_options)
        _CHECKED[key] = build_setup(plan.params, plan.dataset, storage, plan.retrieval, plan.retriever is not None)
    return _CHECKED[key]


def _cut(value: str) -> str:
    """An id quoted, cut to 40 characters (a file given as --qrels by mistake: its lines' first fields)."""
    return repr(value) if len(value) <= 40 else f"{value[:40]!r}..."


def _check_qrels_rows(params: RunParams, dataset: Dataset, setup: IdSetup) -> str | None:
    """The qrels' coverage of the rows, by ``--retrieval-uri``'s rule (``checks.check_retrieval_coverage``).

    Refused when no row id of the dataset has judgements; refused too when, under ``--on-missing error``, the rows
    without judgements exceed ``--max-error-rate``: the run's figures would be those of the few rows judged, with
    a CI of a handful of rows (1 of 100 read recall@10 1.0 [1, 1], completed). Otherwise a note with the count
    (those rows are not assessed), None when every row id has judgements."""
    known = set(setup.qrels.query_ids.to_pylist())
    total = found = 0
    examples: list[str] = []
    for row_id in iter_row_ids(dataset):
        total += 1
        if row_id in known:
            found += 1
        elif len(examples) < 2:
            examples.append(row_id)
    if total and found == 0:
        theirs = ", ".join(_cut(v) for v in sorted(known)[:2]) or "none"
        raise ConfigError(
            f"--qrels: 0 of {total} row ids found in {params.qrels_uri} (dataset ids such as "
            f"{', '.join(map(_cut, examples))}; the qrels have query ids such as {theirs}): the query ids must be the "
            'dataset\'s row_id values (docs/usage.md, "Row ids")'
        )
    if found == total:
        return None
    head = f"--qrels: {found} of {total} row ids found in the qrels file {params.qrels_uri}; the {total - found} others"
    such = f"(such as {', '.join(map(_cut, examples))})"
    if params.on_missing == "error" and (total - found) / total > params.max_error_rate:
        raise ConfigError(
            f"{head} {such} have no judgements and would not be assessed: more than --max-error-rate "
            f"{params.max_error_rate:g} of the rows (--on-missing error), the run's figures would be those of the "
            f"{found} judged alone; give the qrels every row id, or --on-missing skip to score the {found} judged"
        )
    return f"{head} {such} have no judgements: not assessed (no id metrics; skipped in a retrieval_ids run)"


def scan(dataset: Dataset, setup: IdSetup, retrieval: RetrievalResults | None) -> None:
    """Normalise every id value once (only the id columns are read): a bad value fails here, before any write."""
    roles = dict(setup.columns)
    if roles:
        for f in dataset.files:
            with dataset.fs.open(f.path, "rb") as fh:
                pf = open_parquet(dataset.fs, f.path, f.uri, fh, dataset.json_columns, dataset.text_columns)
                table = pf.read(columns=list(dict.fromkeys(roles.values())))
            found = {
                role: normalise_ids(table.column(col), column=col, source=f.uri, chunk_to_doc=setup.mapping(role))
                for role, col in roles.items()
                if role != RELEVANCE
            }
            if RELEVANCE in roles and RELEVANT in found:
                normalise_relevance(table.column(roles[RELEVANCE]), found[RELEVANT], column=roles[RELEVANCE],
                                    source=f.uri)  # fmt: skip
    if retrieval is not None and retrieval.ids is not None:
        normalise_ids(retrieval.ids, column=IDS, source=retrieval.uri, chunk_to_doc=setup.pattern)


# -- per chunk -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockIds:
    """A block's normalised ids (each ``list<string>``) and each row's id metrics (a map column)."""

    retrieved: pa.Array
    relevant: pa.Array
    relevance: pa.Array | None
    values: pa.Table  # id_metrics' columns: "recall@5", ... (null: not assessed)
    missing: np.ndarray  # rows with no retrieved ids at all (null list): not assessed


def block_ids(setup: IdSetup, block: RowBlock) -> BlockIds:
    """The block's ids from their sources, normalised, and their metrics."""
    n = block.table.num_rows
    table = block.table
    empty = pa.array([[]] * n, _IDS)
    if RETRIEVED in table.column_names:
        raw = table.column(RETRIEVED)
        missing = np.asarray(pc.is_null(raw).to_numpy(zero_copy_only=False), bool)
        retrieved = normalise_ids(raw, column=setup.column(RETRIEVED), source=block.source, chunk_to_doc=setup.pattern)
    else:
        retrieved, missing = empty, np.ones(n, bool)
    relevance = None
    if setup.qrels is not None:
        from recall_tasks.io.qrels import qrels_for

        relevant, relevance = qrels_for(setup.qrels, block.row_ids)
    elif RELEVANT in table.column_names:
        relevant = normalise_ids(table.column(RELEVANT), column=setup.column(RELEVANT), source=block.source)
        if RELEVANCE in table.column_names:
            relevance = normalise_relevance(table.column(RELEVANCE), relevant, column=setup.column(RELEVANCE),
                                            source=block.source)  # fmt: skip
    else:
        relevant = empty
    values = id_metrics(retrieved, relevant, relevance, setup.ks)
    if missing.any():  # no retrieved ids at all: not assessed (a retrieval file lacking the row), never 0
        keep = pa.array(~missing)
        values = pa.table({name: pc.if_else(keep, values.column(name), None) for name in values.column_names})
    return BlockIds(retrieved, relevant, relevance, values, missing)


def metrics_map(values: pa.Table) -> pa.Array:
    """The ``id_metrics`` column: per row a map of the assessed metrics' values; null when none is assessed."""
    names = values.column_names
    n = values.num_rows
    if not names:
        return pa.nulls(n, ID_METRICS_FIELD.type)
    matrix = np.column_stack(
        [np.asarray(pc.fill_null(values.column(c), np.nan).to_numpy(zero_copy_only=False), np.float64) for c in names]
    )
    valid = ~np.isnan(matrix)
    counts = valid.sum(axis=1)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    keys = np.tile(np.array(names, dtype=object), n)[valid.ravel()]
    items = matrix.ravel()[valid.ravel()]
    offsets_array = pa.array(offsets, pa.int32(), mask=np.concatenate([counts == 0, [False]]))
    return pa.MapArray.from_arrays(offsets_array, pa.array(keys, pa.string()), pa.array(items, pa.float64()))


def _with(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, values)
    return table.append_column(name, values)


def with_id_metrics(plan: Any, block: RowBlock, table: pa.Table) -> pa.Table:
    """A judged chunk's result table with its rows' id metrics and normalised ids (unchanged without ids)."""
    setup = setup_of(plan)
    if setup is None:  # one side of the ids only: kept, with the types of a run that has both (ids as strings)
        return _as_stored(table)
    ids = block_ids(setup, block)
    return _add_ids(table, ids)


def _as_stored(table: pa.Table) -> pa.Table:
    """Id columns of a run without id metrics, cast to the types ``_add_ids`` stores (``list<string>`` ids,
    ``list<int64>`` grades) so that the ``results`` table keeps one type per column across runs."""
    for role, typ in ((RETRIEVED, _IDS), (RELEVANT, _IDS), (RELEVANCE, pa.list_(pa.int64()))):
        name = passthrough_name(role)
        if name in table.column_names and table.column(name).type != typ:
            try:
                table = _with(table, name, pc.cast(table.column(name), typ))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                table = table.drop_columns([name])  # not ids (the schema check let it through as a pass-through)
    return table


def _add_ids(table: pa.Table, ids: BlockIds) -> pa.Table:
    table = _with(table, passthrough_name(RETRIEVED), ids.retrieved)
    table = _with(table, passthrough_name(RELEVANT), ids.relevant)
    if ids.relevance is not None:
        table = _with(table, passthrough_name(RELEVANCE), ids.relevance)
    return _with(table, ID_METRICS_FIELD.name, metrics_map(ids.values))


def score_ids_block(plan: Any, block: RowBlock) -> pa.Table:
    """A ``retrieval_ids`` run's chunk: the result columns from the ids alone (no judge, no request)."""
    setup = setup_of(plan)
    if setup is None:  # check_ids refuses such a run: only a plan built around the checks gets here
        raise ConfigError("--metric retrieval_ids: the dataset has no retrieved and relevant document ids")
    ids = block_ids(setup, block)
    n = block.table.num_rows
    score = ids.values.column(setup.verdict) if setup.verdict in ids.values.column_names else pa.nulls(n, pa.float64())
    assessed = pc.is_valid(score)
    unassessed = NOT_ASSESSED if setup.qrels is None else NOT_IN_QRELS.format(setup.qrels.uri)
    reason = pc.if_else(assessed, pa.scalar(None, pa.string()), pa.scalar(unassessed))
    if ids.missing.any():
        reason = pc.if_else(pa.array(ids.missing), pa.scalar(NO_RETRIEVED), reason)
    where = [block.where(i) for i in range(n)]
    params = plan.params
    cols: dict[str, Any] = {
        "row_id": pa.array(block.row_ids, pa.string()),
        "content_hash": pa.array(block.content_hashes, pa.string()),
        "source_file": pa.array([w[0] for w in where], pa.string()),
        "source_row": pa.array([w[1] for w in where], pa.int64()),
        "metric": pa.array(["retrieval_ids"] * n, pa.string()),
        "score": score,
        "success": pc.greater(score, 0.0),
        "threshold": pa.array([params.threshold] * n, pa.float64()),
        "reason": reason,
        "context_count": pa.array(pc.list_value_length(ids.retrieved), pa.int32()),
        "skipped": pc.invert(assessed),
        "cached": pa.array([False] * n),
        "judge_model": pa.array([NO_JUDGE] * n, pa.string()),
        "prompt_version": pa.array([IDS_VERSION] * n, pa.string()),
        "prompt_tokens": pa.array([0] * n, pa.int64()),
        "completion_tokens": pa.array([0] * n, pa.int64()),
        "requests": pa.array([0] * n, pa.int32()),
        "cost_usd": pa.array([0.0] * n, pa.float64()),
    }
    arrays = []
    for f in CHUNK_FIELDS:
        if f.name in cols:
            arrays.append(pc.cast(cols[f.name], f.type))
        elif pa.types.is_list(f.type):
            arrays.append(pa.array([[]] * n, f.type))
        else:
            arrays.append(pa.nulls(n, f.type))
    table = pa.Table.from_arrays(arrays, schema=pa.schema(CHUNK_FIELDS))
    for name in block.table.column_names:
        if name not in ("expected_output", "retrieval_context", "actual_output"):
            table = table.append_column(passthrough_name(name), block.table.column(name))
    return _add_ids(table, ids)


def _digest(qrels: Any) -> str:
    """The qrels' content (a changed file under the same URI is another chunk key)."""
    table = pa.table({"q": qrels.query_ids, "d": qrels.doc_ids, "r": qrels.relevance})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()[:16]


def config_of(params: RunParams) -> dict[str, Any]:
    """What changes the id metrics' values: part of the chunk cache's key (nothing for a run without ids, whose
    key stays what it was)."""
    setup = _CHECKED.get(params.model_dump_json())
    if setup is None and params.metric != "retrieval_ids":
        return {}
    qrels = _digest(setup.qrels) if setup is not None and setup.qrels is not None else None
    return {"ids": [IDS_VERSION, params.k, params.id_pattern, params.qrels_uri, qrels, params.verdict_metric]}


# -- per run -------------------------------------------------------------------------------------


def add_run_columns(plan: Any, parts: list[Any], runs: list[dict[str, Any]]) -> None:
    """The id columns of the run's ``runs`` rows (overall first, then segments), from its chunk files."""
    from recall_tasks.analysis.ids_aggregates import id_stats, no_id_stats

    verdict = plan.params.verdict_metric if plan.params.metric == "retrieval_ids" else plan.params.metric
    for row in runs:
        row.update(no_id_stats(), verdict_metric=verdict)
    if not parts or setup_of(plan) is None:
        return
    columns = [ID_METRICS_FIELD.name, *plan.segment_columns]
    table = pa.Table.from_batches(list(plan.store.read_parts(parts, columns=columns)))
    for row in runs:
        column = row.get("segment_column")
        if column is None:
            row.update(id_stats(table))
            continue
        values = table.column(column)  # the segment values as RunTally.segments names them: str(value)
        same = [v for v in pc.unique(values).to_pylist() if (None if v is None else str(v)) == row["segment_value"]]
        if not same:
            continue
        mask = pc.is_null(values) if same[0] is None else pc.fill_null(pc.equal(values, same[0]), False)
        row.update(id_stats(table.filter(mask)))
