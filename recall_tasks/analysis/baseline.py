"""Baseline selection: which earlier run of the series a run is compared with (``--baseline``).

:func:`find_baseline` picks the overall ``runs`` row named by a spec (``latest``, ``label:<label>``,
``run:<run_id>``), preferring runs comparable with the current one (:mod:`~recall_tasks.analysis.comparability`).
Pure functions over the ``runs`` table; the comparison rules are in docs/regression.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from recall_tasks.analysis.comparability import incomparable_reasons
from recall_tasks.errors import ConfigError

__all__ = ["earlier_statuses", "find_baseline", "no_baseline_text", "other_series"]

#: The statuses ``--baseline latest`` and ``label:`` never choose, in the order ``no_baseline_text`` names them.
NEVER_CHOSEN = ("failed", "budget_exhausted")


def _strings(table: pa.Table, name: str) -> pa.ChunkedArray:
    """A column as plain strings (dictionary-encoded partition columns included)."""
    col = table.column(name)
    return col if col.type == pa.string() else pc.cast(col, pa.string())


def _eq(table: pa.Table, name: str, value: str) -> pa.ChunkedArray:
    return pc.fill_null(pc.equal(_strings(table, name), value), False)


def _most_recent_first(table: pa.Table) -> pa.Table:
    keys = [(k, "descending") for k in ("finished_at", "started_at", "run_id") if k in table.column_names]
    return table.sort_by(keys) if keys else table  # nulls sort last (the default)


def _distinct_recent(table: pa.Table, name: str, limit: int = 10) -> list[str]:
    """Distinct non-null values of a column, most recent run first."""
    if name not in table.column_names:
        return []
    seen: list[str] = []
    for value in _strings(_most_recent_first(table), name).to_pylist():
        if value is not None and value not in seen:
            seen.append(value)
            if len(seen) == limit:
                break
    return seen


def _shown(values: list[str]) -> str:
    return ", ".join(repr(v) for v in values) if values else "none"


def _overall(runs: pa.Table) -> pa.Table:
    if "segment_column" in runs.column_names:
        return runs.filter(pc.is_null(runs.column("segment_column")))
    return runs


def _series(overall: pa.Table, dataset: str, metric: str, dataset_id: str | None) -> pa.Table:
    """The overall rows of one series: ``dataset_id``'s runs (and runs recorded before it by ``dataset`` name).

    A named series (``name:<--dataset-name>``) also holds the runs recorded under that dataset name at any
    location: ``--dataset-name golden_v1`` on a run of ``golden_v2.parquet`` joins the runs of ``golden_v1.parquet``.
    """
    same_dataset = _eq(overall, "dataset", dataset)
    if dataset_id is not None and "dataset_id" in overall.column_names:
        ids = _strings(overall, "dataset_id")
        by_name = same_dataset if dataset_id.startswith("name:") else pc.and_(pc.is_null(ids), same_dataset)
        same_dataset = pc.or_(pc.fill_null(pc.equal(ids, dataset_id), False), by_name)
    return overall.filter(pc.and_(same_dataset, _eq(overall, "metric", metric)))


def earlier_statuses(
    runs: pa.Table, *, dataset: str, metric: str, exclude_run_id: str | None = None, dataset_id: str | None = None
) -> dict[str, int]:
    """How many runs of the series (the one :func:`find_baseline` searches) other than ``exclude_run_id`` ended
    with each status (a run recorded without one counts as ``completed``)."""
    series = _series(_overall(runs), dataset, metric, dataset_id)
    if exclude_run_id is not None:
        series = series.filter(pc.invert(_eq(series, "run_id", exclude_run_id)))
    counts: dict[str, int] = {}
    statuses = _strings(series, "status").to_pylist() if "status" in series.column_names else []
    for status in statuses or ["completed"] * series.num_rows:
        counts[status or "completed"] = counts.get(status or "completed", 0) + 1
    return counts


def other_series(runs: pa.Table, *, dataset: str, metric: str, dataset_id: str | None = None) -> list[str]:
    """The dataset names of the other series of ``metric`` in ``runs`` (not this one), most recent first: what
    ``--dataset-name`` would name to compare a first run with one of them."""
    overall = _overall(runs)
    if "metric" not in overall.column_names or "dataset" not in overall.column_names:
        return []
    same_metric = overall.filter(_eq(overall, "metric", metric))
    mine = set(_strings(_series(same_metric, dataset, metric, dataset_id), "run_id").to_pylist())
    others = same_metric.filter(
        pc.invert(pc.is_in(_strings(same_metric, "run_id"), pa.array(sorted(mine), pa.string())))
    )
    return _distinct_recent(others, "dataset", limit=3)


def no_baseline_text(earlier: dict[str, int]) -> str | None:
    """Why ``--baseline latest`` found no run, from the earlier runs' statuses; None when it had candidates.

    ``first run of its series``, or ``no comparable baseline (3 earlier runs: 2 failed / 1 budget_exhausted)``
    when every earlier run failed or was stopped by a budget (neither is chosen automatically).
    """
    total = sum(earlier.values())
    if total == 0:
        return "first run of its series"
    if any(status not in NEVER_CHOSEN for status in earlier):
        return None
    counts = " / ".join(f"{earlier[s]} {s}" for s in NEVER_CHOSEN if earlier.get(s))
    return f"no comparable baseline ({total} earlier run{'s' if total > 1 else ''}: {counts})"


def _elsewhere(overall: pa.Table, dataset: str, metric: str, dataset_id: str | None, label: str) -> str:
    """A hint when runs with ``label`` exist for a dataset of the same name at another location: another series
    (dated folders of one dataset), which the message's "dataset 'golden'" did not tell apart from this one."""
    if not dataset_id or not {"dataset_id", "label"} <= set(overall.column_names):
        return ""
    same = overall.filter(pc.and_(pc.and_(_eq(overall, "dataset", dataset), _eq(overall, "metric", metric)),
                                  _eq(overall, "label", label)))  # fmt: skip
    others = [d for d in _distinct_recent(same, "dataset_id") if d != dataset_id]
    if not others:
        return ""
    return (
        f"; a run labelled {label!r} exists for {others[0]}, another location: each location is its own series, "
        "so name one series across locations with --dataset-name on every run"
    )


def find_baseline(
    runs: pa.Table,
    *,
    dataset: str,
    metric: str,
    spec: str = "latest",
    exclude_run_id: str | None = None,
    current: Mapping[str, Any] | None = None,
    dataset_id: str | None = None,
) -> dict[str, Any] | None:
    """The overall ``runs`` row of the baseline run chosen by ``spec``, or None when there is none yet.

    ``spec``:
    - ``"latest"``: the most recent (``finished_at``) completed run of the same dataset and metric (never a failed
      nor a budget-stopped one: :func:`no_baseline_text` says so when nothing else is left), other than
      ``exclude_run_id``, preferring runs comparable with ``current`` (the current run's settings, see
      :func:`incomparable_reasons`): with one judge configuration interrupted by another, each run is compared
      with the latest run of its own configuration. When no run is comparable, the latest one is returned (the
      comparison then says ``incomparable`` and why); None when the series is empty (the first run);
    - ``"label:<label>"``: the most recent completed run with that label, same dataset and metric, other than
      ``exclude_run_id``, comparable ones first;
    - ``"run:<run_id>"`` or a bare run id: that run (an explicit choice), unless it failed or has not finished
      (a failed run is never a baseline; a ``budget_exhausted`` one is, when named: its judged rows are paired,
      the rest count as unscored); preferably its row for ``dataset``/``metric``, else its only overall
      row (a mismatch is then flagged by ``regression.compare_runs``).

    The series is the runs of ``dataset_id`` (a normalised URI or ``name:<--dataset-name>``) when given, so two
    unrelated datasets that share a file name never pair; runs recorded before ``dataset_id`` existed match by
    ``dataset`` name. Only overall rows (``segment_column`` null) are considered. An explicit label or run id
    that matches nothing raises :class:`ConfigError` listing some that exist.
    """
    spec = (spec or "").strip()
    if not spec:
        raise ConfigError("baseline spec is empty; use 'latest', 'label:<label>', 'run:<run_id>' or a run id")
    for required in ("run_id", "dataset", "metric"):
        if required not in runs.column_names:
            raise ConfigError(f"the runs table has no {required!r} column; columns: {runs.column_names}")

    overall = _overall(runs)
    series = _series(overall, dataset, metric, dataset_id)
    completed = series
    if "status" in series.column_names:
        completed = series.filter(_eq(series, "status", "completed"))
    if exclude_run_id is not None:
        completed = completed.filter(pc.invert(_eq(completed, "run_id", exclude_run_id)))

    def first(table: pa.Table) -> dict[str, Any] | None:
        if table.num_rows == 0:
            return None
        rows: list[dict[str, Any]] = _most_recent_first(table).to_pylist()
        if current is not None:
            for row in rows:
                if not incomparable_reasons(current, row):
                    return row
        return rows[0]

    if spec.lower() == "latest":
        return first(completed)

    if spec.startswith("label:"):
        label = spec[len("label:") :].strip()
        if not label:
            raise ConfigError("baseline spec 'label:' needs a label, e.g. 'label:prod'")
        if "label" not in completed.column_names:
            raise ConfigError(f"no run labelled {label!r}: the runs table has no 'label' column")
        found = first(completed.filter(_eq(completed, "label", label)))
        if found is None:
            raise ConfigError(
                f"no completed run labelled {label!r} for dataset {dataset!r} and metric {metric!r}"
                f"{' other than the current run' if exclude_run_id else ''}; "
                f"labels available: {_shown(_distinct_recent(completed, 'label'))}"
                f"{_elsewhere(overall, dataset, metric, dataset_id, label)}"
            )
        return found

    run_id = spec[len("run:") :].strip() if spec.startswith("run:") else spec
    if not run_id:
        raise ConfigError("baseline spec 'run:' needs a run id, e.g. 'run:20240601-abcdef'")
    if exclude_run_id is not None and run_id == exclude_run_id:
        raise ConfigError(f"the baseline run {run_id!r} is the run being compared; choose an earlier run")
    candidates = overall.filter(_eq(overall, "run_id", run_id))
    if candidates.num_rows == 0:
        recent = _distinct_recent(completed, "run_id")  # this series' only: another dataset's run is no candidate
        raise ConfigError(
            f"no run with id {run_id!r} in the runs table; recent runs of dataset {dataset!r} and metric "
            f"{metric!r}: {_shown(recent)}"
        )
    same_series = candidates.filter(pc.and_(_eq(candidates, "dataset", dataset), _eq(candidates, "metric", metric)))
    chosen: dict[str, Any] = _most_recent_first(same_series if same_series.num_rows else candidates).to_pylist()[0]
    status = chosen.get("status")
    if status not in (None, "completed", "budget_exhausted"):
        raise ConfigError(
            f"run {run_id!r} has status {status!r}: a failed or unfinished run is never a baseline; "
            f"completed runs of dataset {dataset!r}: {_shown(_distinct_recent(completed, 'run_id'))}"
        )
    return chosen
