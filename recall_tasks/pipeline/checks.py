"""The checks a run passes before any judge call or write, one function each; each raises one clear error.

``steps.check_run`` runs them in order of cost (with the dataset, retriever, store and judge it opens in
between) and returns a :class:`Checked`; ``steps.plan_run`` runs that first, inside the flow, before the lease.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from recall_tasks.analysis.baseline import find_baseline
from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError, DatasetError
from recall_tasks.io.blocks import iter_row_ids
from recall_tasks.io.columns import parse_column_overrides, stored_type, type_name
from recall_tasks.io.datasets import Dataset
from recall_tasks.io.delta import check_location
from recall_tasks.io.iceberg import iceberg_type
from recall_tasks.io.results import ResultStore
from recall_tasks.io.retrieval import RetrievalResults, Retriever
from recall_tasks.io.schemas import passthrough_name
from recall_tasks.io.storage import StorageConfig, location_of, normalize_uri, overlap
from recall_tasks.io.traces import TraceContext
from recall_tasks.judges.capabilities import CostBounded, Priced
from recall_tasks.judges.pricing import price_for
from recall_tasks.metrics.base import Metric

if TYPE_CHECKING:
    from recall_tasks.pipeline.canary import Canary


@dataclass
class Checked:
    """What the checks before a run produced (and what they noted without stopping it)."""

    storage: StorageConfig
    dataset: Dataset
    store: ResultStore
    metric: Metric
    segments: list[str]
    retriever: Retriever | None
    retrieval: RetrievalResults | None
    notes: list[str] = field(default_factory=list)
    trace: TraceContext | None = None
    canary: Canary | None = None  # the --canary labelled set, read and checked


def check_output_location(params: RunParams) -> None:
    """Refuse an output equal to, inside, or containing the dataset's location (or the retrieval results'), and one
    whose name the table writer cannot take (:func:`check_output_name`).

    Tables written among the dataset's files would be read as data by the next run (and a dataset folder
    inside the output can be overwritten by it).
    """
    check_output_name(params.output_uri, params.format)
    out = normalize_uri(params.output_uri)
    for what, uri in (("dataset", params.dataset_uri), ("retrieval results", params.retrieval_uri)):
        if not uri:
            continue
        relation = overlap(out, location_of(uri))
        if relation is not None:
            said = {"equal": "is", "inside": "is inside", "contains": "contains"}[relation]
            raise ConfigError(
                f"--output {params.output_uri} {said} the {what} location {uri}: results would be written among "
                f"the {what}'s files; choose an output folder of its own"
            )


def check_output_name(output_uri: str, fmt: str) -> None:
    """An output the format's writer cannot keep tables under is refused before any judge call, not at the commit
    after the whole dataset was paid for: for Delta, a path deltalake would fail on or write elsewhere
    (:func:`~recall_tasks.io.delta.location_problem`: the error names what and suggests a name). Parquet and Iceberg
    take any name."""
    if fmt == "delta":
        check_location(output_uri)


def check_baseline_reference(params: RunParams, store: ResultStore, dataset: Dataset) -> None:
    """An explicit ``--baseline`` (run id or label) must name a usable run before anything is judged."""
    spec = (params.baseline or "").strip()
    if not spec or spec.lower() == "latest":
        return
    runs = store.read_table("runs")
    if runs is None:
        raise ConfigError(
            f"--baseline {spec}: no runs are recorded under {params.output_uri} yet; "
            "use --baseline latest (the default) or none"
        )
    find_baseline(runs.to_table(), dataset=dataset.name, metric=params.metric, spec=spec, dataset_id=dataset.identity)


def check_segments(params: RunParams, dataset: Dataset) -> list[str]:
    """The ``--segment-by`` columns as stored: each a pass-through column of the dataset, and not nested."""
    segments = []
    for col in params.segment_by:
        if col not in dataset.passthrough:
            available = ", ".join(dataset.passthrough) or "none"
            raise DatasetError(
                f"--segment-by {col}: not a pass-through column; available: {available}",
                uri=params.dataset_uri, column=col,
            )  # fmt: skip
        typ = dataset.passthrough_types[col]
        if pa.types.is_nested(typ):
            raise DatasetError(
                f"--segment-by {col}: a {type_name(typ)} column cannot segment a run; segment by a text, number, "
                "boolean or date column",
                uri=dataset.files[0].uri, column=col,
            )  # fmt: skip
        segments.append(passthrough_name(col))
    return segments


def check_results_schema(dataset: Dataset, store: ResultStore) -> None:
    """A pass-through column must have the type the existing ``results`` table has under its name.

    Checked before judging: Delta's schema merge would refuse the commit after every row was paid for. Names
    are compared ignoring case (Delta's rule); timestamps compare by unit and by having a time zone or not
    (Delta stores instants in UTC).
    """
    existing = store.read_table("results")
    if existing is None:
        return
    by_lower = {f.name.lower(): f for f in existing.schema}
    iceberg = store.format == "iceberg"
    for col in dataset.passthrough:
        name, typ = passthrough_name(col), dataset.passthrough_types[col]
        old = by_lower.get(name.lower())
        if old is None:
            continue
        if old.name != name:
            raise DatasetError(
                f"pass-through column stored as {name!r}, but the results table {store.results_uri} has "
                f"{old.name!r}, which differs only in case: rename the column or write to another --output",
                uri=dataset.files[0].uri, column=col,
            )  # fmt: skip
        if _comparable(old.type, iceberg) != _comparable(typ, iceberg):
            raise DatasetError(
                f"pass-through column is {type_name(typ)}, but the results table {store.results_uri} has "
                f"{old.name!r} as {type_name(old.type)}: cast the column, rename it, or write to another --output",
                uri=dataset.files[0].uri, column=col,
            )  # fmt: skip


def _comparable(t: pa.DataType, iceberg: bool = False) -> str:
    with contextlib.suppress(ValueError):
        t = stored_type(t)
    if iceberg:  # Iceberg has no 8- or 16-bit integers: they are stored as int
        t = iceberg_type(t)
    if pa.types.is_timestamp(t) and t.tz:
        t = pa.timestamp(t.unit, tz="UTC")
    return type_name(t)


def check_priced(params: RunParams, judge: object) -> None:
    """``--max-cost-usd`` needs a price for every model the run calls: an unpriced call costs None, which no budget
    can count, so the run is refused before it starts (on every task runner), never left unbounded."""
    if not params.max_cost_usd or not isinstance(judge, Priced):  # the lexical judge has no prices: it costs nothing
        return
    models = [params.model, *([params.extractor_model] if params.units == "claims" and params.extractor_model else [])]
    unpriced = [m for m in dict.fromkeys(models) if price_for(m, judge.prices) is None]
    if unpriced:
        raise ConfigError(
            f"--max-cost-usd {params.max_cost_usd:g} cannot bound model {', '.join(unpriced)}: recall-bench knows no "
            f"price for it; give one with --price {unpriced[0]}=IN,OUT (USD per million input and output tokens; "
            "0,0 for a free model), or bound the run with --max-requests instead"
        )
    if isinstance(judge, CostBounded):
        worst, size, limit = judge.least_worst_cost()
        if params.max_cost_usd < worst:
            raise ConfigError(
                f"--max-cost-usd {params.max_cost_usd:g} is below the worst case of one judge request ({worst:.6g} "
                f"USD for {params.model}: a prompt of up to {size} tokens plus {limit} completion tokens), so no "
                "request could be sent: raise it"
            )


def check_context_source(params: RunParams, dataset: Dataset) -> TraceContext | None:
    """``--context-from`` / ``--context-extractor``: one source of contexts at most; the extractor loaded."""
    if not (params.context_from or params.context_extractor):
        if "messages" in parse_column_overrides(params.columns):
            raise ConfigError("--column messages=NAME needs --context-from or --context-extractor")
        return None
    given = [o for o, v in (("--context-from", params.context_from), ("--context-extractor", params.context_extractor),
             ("--retriever", params.retriever), ("--retrieval-uri", params.retrieval_uri)) if v]  # fmt: skip
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)} both supply the retrieval context: give one")
    return TraceContext.from_options(params.context_from, params.context_extractor, dataset.columns["messages"])


def check_retrieval_coverage(params: RunParams, dataset: Dataset, retrieval: RetrievalResults) -> str | None:
    """``--retrieval-uri`` must hold contexts for the dataset's rows, matched by row id.

    Policy: refused (one error naming both sides' ids) when none of the dataset's row ids is in the file: every
    row would go unjudged, whatever ``--on-missing`` says; refused too when, under ``--on-missing error``, the
    missing share alone exceeds ``--max-error-rate`` (each missing row is an error: the run could only fail, after
    paying for the others). Otherwise the run goes on and this returns a note with the count (those rows get no
    context and follow ``--on-missing``). Reads only the dataset's id
    columns (``row_id``, else the question and reference answer the ids are hashed from: ``io/blocks.py``).
    """
    known = set(retrieval.row_ids.to_pylist())
    total = found = 0
    missing: list[str] = []
    for row_id in iter_row_ids(dataset):
        total += 1
        if row_id in known:
            found += 1
        elif len(missing) < 2:
            missing.append(row_id)
    if found == total:
        return None
    uri = params.retrieval_uri
    if found == 0:
        theirs = ", ".join(repr(v) for v in list(dict.fromkeys(retrieval.row_ids.to_pylist()))[:2]) or "none"
        how = (
            "the dataset has a row_id column: the retrieval file must use the same values"
            if dataset.has_row_id
            else "the dataset has no row_id column, so its ids are hashes of input and expected_output that an "
            "index build cannot know: add a row_id column to the dataset and write the same ids in the retrieval file"
        )
        raise ConfigError(
            f"--retrieval-uri: 0 of {total} row ids found in the retrieval file {uri} (dataset ids such as "
            f'{", ".join(repr(v) for v in missing)}; the file has {theirs}); {how} (docs/usage.md, "Row ids")'
        )
    head = f"--retrieval-uri: {found} of {total} row ids found in the retrieval file {uri}; the {total - found} others"
    examples = f"(such as {', '.join(repr(v) for v in missing)})"
    if params.on_missing == "error" and (total - found) / total > params.max_error_rate:
        raise ConfigError(
            f"{head} {examples} would each end in an error (--on-missing error), more than --max-error-rate "
            f"{params.max_error_rate:g} of the rows: the run would fail after judging the rest; give the file every "
            f"row id, or --on-missing skip to score the {found} found"
        )
    return f"{head} {examples} get no context and follow --on-missing {params.on_missing}"
