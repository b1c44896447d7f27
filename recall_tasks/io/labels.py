"""Labelled sets: a dataset plus the human verdict of each unit (or of each row), for ``calibrate`` and canaries.

A labelled set is ONE file, JSON Lines (``.jsonl``/``.ndjson``/``.json``, one object a line) or Parquet
(``.parquet``/``.pq``), local or on any fsspec storage (``s3://...``). Two shapes, told apart by their columns:

1. **Dataset rows** (the shape to write): the columns of ``recall-bench run``'s input, found under the same
   default names and ``--column role=NAME`` overrides (``io/columns.py``), plus:

   - ``labels``: ``list<bool>``, the human verdict of each unit, in order (``true`` = supported / used);
   - ``sentences`` (optional, contextual recall): ``list<string>``, the units the labels belong to;
   - ``expected_score`` (instead of, or besides, ``labels``): the row's human score in 0..1, for sets labelled
     per row only (then only the row-score figures, MAE and Spearman, use the row);
   - ``category`` (optional): a segment name, figures are also given per category;
   - ``task`` (optional): ``contextual_recall`` or ``context_coverage`` for this row (default: the command's
     ``--metric``); one set may mix both.

   The units are what a run judges, so a labelled set calibrates the judge exactly as runs use it (and its
   verdicts share the runs' cache): for contextual recall, the sentences of ``expected_output`` as
   :func:`recall_tasks.sentences.split_sentences` splits them; for context coverage, the retrieval-context
   items. ``labels`` must have one verdict per unit. When ``sentences`` is given it must equal the splitter's
   sentences (so a label can never silently attach to another sentence); when ``expected_output`` is absent,
   it is the sentences joined by spaces, which must split back into the same sentences.

2. **One unit per row** (the format of ``tests/data/lexical_*.jsonl``): ``statement`` (the unit), ``evidence``
   (``list<string>``), ``label`` (``"yes"``/``"no"`` or a bool), optional ``question``, ``task``, ``category``.
   A recall row becomes reference = the statement, context = the evidence; a coverage row becomes context =
   [the statement], answer = the evidence joined by spaces (re-split into sentences as a run does).

Bad input: one :class:`~recall_tasks.errors.DatasetError` naming the file, the row (0-based line or row
index) and the column, raised by :func:`load_labels` before anything is judged: unreadable or empty file, a
line that is not a JSON object, a missing required column, a value of the wrong type, a label count that
differs from the unit count, a ``sentences`` list that differs from the splitter's, a score outside 0..1, a row
with neither labels nor expected score, duplicate ``row_id`` values.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
import pyarrow.parquet as pq

from recall_tasks.errors import DatasetError, StorageError, one_line
from recall_tasks.io.columns import DEFAULT_NAMES, JUDGED_ROLES, REQUIRED
from recall_tasks.io.datasets import dataset_name
from recall_tasks.io.storage import StorageConfig, filesystem, translate_storage_error
from recall_tasks.judges.base import Task
from recall_tasks.sentences import split_sentences

__all__ = ["LabelledRow", "LabelledSet", "load_labels"]

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet", ".pq")
_ROLES = (*JUDGED_ROLES, "row_id")
_TASKS: tuple[Task, ...] = ("contextual_recall", "context_coverage")


@dataclass(frozen=True)
class LabelledRow:
    """One labelled row, ready for the judge machinery.

    ``row``: the case as ``pipeline.scoring.score_rows`` takes it (``input``, ``expected_output``,
    ``retrieval_context``, ``actual_output``). ``units``: the units the labels belong to (what the judge will be
    asked about, in order), ``None`` for a row labelled only by score. ``key``: the ``row_id`` when the set has
    one, else ``#<index>`` (stable while the file is unchanged; pairs the rows of two judgings of one set).
    """

    key: str
    index: int
    task: Task
    row: dict[str, Any]
    units: list[str] | None
    labels: list[bool] | None
    expected_score: float | None
    category: str | None

    @property
    def human_score(self) -> float | None:
        """The human row score: ``expected_score`` when given, else the share of units labelled supported."""
        if self.expected_score is not None:
            return self.expected_score
        return sum(self.labels) / len(self.labels) if self.labels else None


@dataclass(frozen=True)
class LabelledSet:
    """A validated labelled set: its rows, and what identifies it (``fingerprint``: a hash of its content)."""

    uri: str
    name: str
    rows: list[LabelledRow]
    fingerprint: str
    shape: str  # "dataset" or "unit-per-row"

    @property
    def units(self) -> int:
        return sum(len(r.labels or []) for r in self.rows)

    def tasks(self) -> list[Task]:
        """The tasks its rows use, in a fixed order."""
        present = {r.task for r in self.rows}
        return [t for t in _TASKS if t in present]


def load_labels(
    uri: str,
    storage: StorageConfig | None = None,
    metric: str = "contextual_recall",
    overrides: Mapping[str, str] | None = None,
) -> LabelledSet:
    """Read and validate a labelled set (see the module docstring); one DatasetError for the first problem."""
    if metric not in _TASKS:
        raise DatasetError(f"unknown metric {metric!r}; choose {', '.join(_TASKS)}")
    records, names = _read(uri, storage)
    if not records:
        raise DatasetError("labelled set has no rows", uri=uri)
    unit_shape = "statement" in names and "labels" not in names
    rows = (
        [_unit_row(uri, i, rec, metric) for i, rec in enumerate(records)]
        if unit_shape
        else _dataset_rows(uri, records, names, metric, dict(overrides or {}))
    )
    digest = hashlib.sha256()
    for r in rows:
        payload = [r.key, r.task, r.row, r.units, r.labels, r.expected_score, r.category]
        digest.update(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode())
    return LabelledSet(
        uri=uri,
        name=dataset_name(uri.removesuffix(".jsonl").removesuffix(".ndjson").removesuffix(".json")),
        rows=rows,
        fingerprint=digest.hexdigest()[:16],
        shape="unit-per-row" if unit_shape else "dataset",
    )


# ------------------------------------------------------------------------------------------ reading


def _read(uri: str, storage: StorageConfig | None) -> tuple[list[dict[str, Any]], list[str]]:
    """The file's records and column names (first-seen order)."""
    if not uri or not uri.strip():
        raise DatasetError("the labelled set's URI is empty: give a .jsonl or .parquet file")
    lower = uri.lower()
    if not lower.endswith(JSONL_SUFFIXES + PARQUET_SUFFIXES):
        raise DatasetError(
            "a labelled set is one .jsonl (.ndjson, .json) or .parquet (.pq) file; this name has neither suffix",
            uri=uri,
        )
    try:
        fs, path = filesystem(uri, storage)
    except (ValueError, ImportError, OSError) as exc:
        raise DatasetError(f"cannot open the labelled set's storage: {one_line(exc)}", uri=uri) from None
    try:
        if not fs.exists(path):
            raise StorageError(f"labelled set not found: {uri}")
        with fs.open(path, "rb") as fh:
            raw = fh.read()
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 - every storage failure becomes one clear message
        raise translate_storage_error(exc, uri, fs=fs) from None
    if lower.endswith(PARQUET_SUFFIXES):
        try:
            table = pq.read_table(pa.BufferReader(raw))
        except (pa.ArrowInvalid, OSError, ValueError) as exc:
            raise DatasetError(f"not a readable Parquet file: {one_line(exc)}", uri=uri) from None
        return table.to_pylist(), list(table.column_names)
    records: list[dict[str, Any]] = []
    names: dict[str, None] = {}
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"not UTF-8 text: {exc.reason} at byte {exc.start}", uri=uri) from None
    for n, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"line {n + 1} is not JSON: {exc.msg} at column {exc.colno}", uri=uri) from None
        if not isinstance(rec, dict):
            raise DatasetError(f"line {n + 1} is a JSON {type(rec).__name__}, not an object", uri=uri)
        records.append(rec)
        names.update(dict.fromkeys(rec))
    return records, list(names)


# ------------------------------------------------------------------------------------------ validation


def _cut(value: Any, limit: int) -> str:
    """An offending field's value quoted, cut to its first ``limit`` characters (never a whole record)."""
    if isinstance(value, str):
        return repr(value) if len(value) <= limit else f"{value[:limit]!r}..."
    shown = repr(value)
    return shown if len(shown) <= limit else f"{shown[:limit]}..."


def _text(uri: str, i: int, column: str, value: Any, required: bool) -> str | None:
    if value is None:
        if required:
            raise DatasetError("missing value: this column is required", uri=uri, row=i, column=column)
        return None
    if not isinstance(value, str):
        raise DatasetError(f"expected a string, found {type(value).__name__}", uri=uri, row=i, column=column)
    if required and not value.strip():
        raise DatasetError("empty value: this column is required", uri=uri, row=i, column=column)
    return value


def _strings(uri: str, i: int, column: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        found = type(value).__name__ if not isinstance(value, list) else "a list with non-string items"
        raise DatasetError(f"expected a list of strings, found {found}", uri=uri, row=i, column=column)
    return list(value)


def _bools(uri: str, i: int, column: str, value: Any) -> list[bool]:
    if not isinstance(value, list) or not all(isinstance(v, bool) for v in value):
        found = type(value).__name__ if not isinstance(value, list) else "a list with non-boolean items"
        raise DatasetError(
            f"expected a list of booleans (true = supported), found {found}", uri=uri, row=i, column=column
        )
    return list(value)


def _task(uri: str, i: int, value: Any, default: Task) -> Task:
    if value is None:
        return default
    if value not in _TASKS:
        raise DatasetError(f"unknown task {_cut(value, 20)}; choose {', '.join(_TASKS)}", uri=uri, row=i,
                           column="task")  # fmt: skip
    return cast(Task, value)


def _category(uri: str, i: int, value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    raise DatasetError(f"expected a string, found {type(value).__name__}", uri=uri, row=i, column="category")


def _unit_row(uri: str, i: int, rec: dict[str, Any], default: Task) -> LabelledRow:
    task = _task(uri, i, rec.get("task"), default)
    statement = cast(str, _text(uri, i, "statement", rec.get("statement"), True))
    evidence = _strings(uri, i, "evidence", rec.get("evidence"))
    question = _text(uri, i, "question", rec.get("question"), False) or ""
    label = rec.get("label")
    if isinstance(label, str) and label.strip().lower() in ("yes", "no"):
        verdict = label.strip().lower() == "yes"
    elif isinstance(label, bool):
        verdict = label
    else:
        raise DatasetError(f'expected "yes", "no" or a boolean, found {_cut(label, 8)}', uri=uri, row=i,
                           column="label")  # fmt: skip
    if task == "contextual_recall":
        row = {"input": question, "expected_output": statement, "retrieval_context": evidence, "actual_output": None}
        units = split_sentences(statement)
        if units != [statement.strip()]:
            raise DatasetError(
                f"the statement splits into {len(units)} sentences; one unit per row needs one sentence",
                uri=uri, row=i, column="statement",
            )  # fmt: skip
    else:
        row = {"input": question, "expected_output": None, "retrieval_context": [statement],
               "actual_output": " ".join(evidence)}  # fmt: skip
        units = [statement]
    key = str(rec["row_id"]) if rec.get("row_id") is not None else f"#{i}"
    return LabelledRow(key, i, task, row, units, [verdict], None, _category(uri, i, rec.get("category")))


def _dataset_rows(
    uri: str, records: list[dict[str, Any]], names: list[str], default: Task, overrides: dict[str, str]
) -> list[LabelledRow]:
    present = set(names)
    columns: dict[str, str] = {}
    for role in _ROLES:
        if role in overrides:
            if overrides[role] not in present:
                raise DatasetError(
                    f"column {overrides[role]!r} given for {role} is not in the file; it has {', '.join(names)}",
                    uri=uri, column=overrides[role],
                )  # fmt: skip
            columns[role] = overrides[role]
        else:
            found = next((c for c in DEFAULT_NAMES[role] if c in present), None)
            if found is not None:
                columns[role] = found
    if "labels" not in present and "expected_score" not in present:
        raise DatasetError(
            "no labels: a labelled set needs a labels column (list of booleans, one per unit) or an "
            "expected_score column (0..1), or the one-unit-per-row shape (statement, evidence, label); "
            f"the file has {', '.join(names)}",
            uri=uri, column="labels",
        )  # fmt: skip
    tasks = {_task(uri, i, rec.get("task"), default) for i, rec in enumerate(records)}
    for task in tasks:
        for role in REQUIRED[task]:
            if role not in columns and not (role == "expected_output" and "sentences" in present):
                raise DatasetError(
                    f"no {role} column for {task}: expected one of {', '.join(DEFAULT_NAMES[role])} or "
                    f"--column {role}=NAME; the file has {', '.join(names)}",
                    uri=uri, column=role,
                )  # fmt: skip
    rows: list[LabelledRow] = []
    seen: dict[str, int] = {}
    for i, rec in enumerate(records):
        rows.append(_dataset_row(uri, i, rec, columns, default))
        if "row_id" in columns:
            key = rows[-1].key
            if key in seen:
                raise DatasetError(
                    f"row_id {_cut(key, 80)} already used by row {seen[key]}: row ids must be unique",
                    uri=uri, row=i, column=columns["row_id"],
                )  # fmt: skip
            seen[key] = i
    return rows


def _dataset_row(uri: str, i: int, rec: dict[str, Any], columns: dict[str, str], default: Task) -> LabelledRow:
    task = _task(uri, i, rec.get("task"), default)
    col = columns.get
    question = _text(uri, i, col("input", "input"), rec.get(col("input", "")), False) or ""
    context_col = col("retrieval_context", "retrieval_context")
    context = _strings(uri, i, context_col, rec.get(context_col))
    if not any(c.strip() for c in context):
        raise DatasetError("empty context: a labelled row needs at least one context item", uri=uri, row=i,
                           column=context_col)  # fmt: skip
    labels = None if rec.get("labels") is None else _bools(uri, i, "labels", rec.get("labels"))
    score = rec.get("expected_score")
    if score is not None:
        if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
            raise DatasetError(f"expected a number in 0..1, found {_cut(score, 8)}", uri=uri, row=i,
                               column="expected_score")  # fmt: skip
        score = float(score)
    if labels is None and score is None:
        raise DatasetError("no human verdict: give labels or expected_score", uri=uri, row=i, column="labels")
    given = None if rec.get("sentences") is None else _strings(uri, i, "sentences", rec.get("sentences"))
    reference = answer = None
    if task == "contextual_recall":
        ref_col = col("expected_output", "expected_output")
        reference = _text(uri, i, ref_col, rec.get(ref_col), False)
        if reference is None and given is not None:
            reference = " ".join(s.strip() for s in given)
        if reference is None or not reference.strip():
            raise DatasetError("missing value: the reference answer is required", uri=uri, row=i, column=ref_col)
        units = split_sentences(reference)
        if given is not None and [s.strip() for s in given] != units:
            first = next((k for k, (a, b) in enumerate(zip(given, units, strict=False)) if a.strip() != b), None)
            detail = (
                f"sentence {first + 1} is {_cut(given[first], 40)} but the splitter gives {_cut(units[first], 40)}"
                if first is not None
                else f"{len(given)} sentences given, the splitter finds {len(units)}"
            )
            raise DatasetError(
                f"sentences differ from the reference's sentences as runs split them: {detail}",
                uri=uri, row=i, column="sentences",
            )  # fmt: skip
    else:
        ans_col = col("actual_output", "actual_output")
        answer = _text(uri, i, ans_col, rec.get(ans_col), True)
        if not split_sentences(answer or ""):
            raise DatasetError("the answer has no sentence", uri=uri, row=i, column=ans_col)
        units = context
        if given is not None and given != units:
            raise DatasetError(
                "for context_coverage the units are the context items; sentences, when given, must equal them",
                uri=uri, row=i, column="sentences",
            )  # fmt: skip
    if labels is not None and len(labels) != len(units):
        what = "sentences in the reference" if task == "contextual_recall" else "context items"
        raise DatasetError(
            f"{len(labels)} labels for {len(units)} {what}: give one label per unit, in order",
            uri=uri, row=i, column="labels",
        )  # fmt: skip
    row = {"input": question, "expected_output": reference, "retrieval_context": context, "actual_output": answer}
    rid = rec.get(columns["row_id"]) if "row_id" in columns else None
    if "row_id" in columns and (rid is None or str(rid) == ""):
        raise DatasetError("row_id is empty: every row needs an id", uri=uri, row=i, column=columns["row_id"])
    key = str(rid) if rid is not None else f"#{i}"
    return LabelledRow(key, i, task, row, units, labels, score, _category(uri, i, rec.get("category")))
