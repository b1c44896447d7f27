"""The result tables' schemas: per-row results (and chunk files), runs, comparisons; pass-through column names.

Storage facts, so they live in the storage layer: the scorer fills these columns, the result store
(:mod:`~recall_tasks.io.results`) writes them, the regression check and the reports read them.
"""

from __future__ import annotations

import pyarrow as pa

VERDICT_TYPE = pa.struct(
    [
        ("statement", pa.string()),
        ("verdict", pa.string()),
        ("reason", pa.string()),
        ("chunk_ids", pa.list_(pa.int32())),
    ]
)

RESULT_FIELDS: list[pa.Field] = [
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("row_id", pa.string(), nullable=False),
    pa.field("content_hash", pa.string()),
    pa.field("source_file", pa.string()),
    pa.field("source_row", pa.int64()),
    pa.field("metric", pa.string()),
    pa.field("score", pa.float64()),
    pa.field("success", pa.bool_()),
    pa.field("threshold", pa.float64()),
    pa.field("reason", pa.string()),
    pa.field("verdicts", pa.list_(VERDICT_TYPE)),
    pa.field("sentence_count", pa.int32()),
    pa.field("attributed_count", pa.int32()),
    pa.field("context_count", pa.int32()),
    pa.field("context_precision", pa.float64()),
    pa.field("chunks_used", pa.int32()),
    pa.field("first_relevant_rank", pa.int32()),
    pa.field("skipped", pa.bool_()),
    pa.field("error", pa.string()),
    pa.field("cached", pa.bool_()),
    pa.field("judge_model", pa.string()),
    pa.field("prompt_version", pa.string()),
    pa.field("prompt_tokens", pa.int64()),
    pa.field("completion_tokens", pa.int64()),
    pa.field("requests", pa.int32()),
    pa.field("cost_usd", pa.float64()),
    pa.field("latency_ms", pa.float64()),
    pa.field("flags", pa.list_(pa.string())),
    #: the model the judge's reply named (null: not judged, not said, or a table written before the column)
    pa.field("reply_model", pa.string()),
]
#: Result columns added after the table's first release: older tables evolve by taking them (Delta's schema merge,
#: Iceberg's union by name, Parquet files without them read null).
LATE_RESULT_FIELDS = ("reply_model", "label", "id_metrics", "retrieved_context_ids", "reference_context_ids",
                      "reference_context_relevance")  # fmt: skip
#: ``results.id_metrics``: the row's id-based retrieval metrics (``"recall@10" -> 0.8``; a metric not assessed is
#: absent, a row with none is null), and its ids as compared (normalised: strings, chunk ids mapped to documents).
#: Only in runs whose rows have ids (docs/warehouse.md, "Id-based retrieval metrics").
ID_METRICS_FIELD = pa.field("id_metrics", pa.map_(pa.string(), pa.float64()))
ID_RESULT_FIELDS: list[pa.Field] = [
    ID_METRICS_FIELD,
    pa.field("retrieved_context_ids", pa.list_(pa.string())),
    pa.field("reference_context_ids", pa.list_(pa.string())),
    pa.field("reference_context_relevance", pa.list_(pa.int64())),
]
CHUNK_FIELDS = RESULT_FIELDS[1:]  # a chunk file is run-independent: run_id is added at commit
#: ``results.label``: the run's ``--label`` on each row (filter results by label without a join to ``runs``). Added
#: at commit, after ``dataset`` and ``run_date``: the last column, so older tables evolve by appending it (Delta's
#: schema merge, Iceberg's union by name, Parquet files without it read null).
LABEL_FIELD = pa.field("label", pa.string())
RESERVED = {f.name for f in RESULT_FIELDS} | {"dataset", "run_date", LABEL_FIELD.name, ID_METRICS_FIELD.name}
_RESERVED_LOWER = {n.lower() for n in RESERVED}


def passthrough_name(name: str) -> str:
    """Pass-through columns keep their name unless it collides with a result column (then ``data_<name>``).

    Compared ignoring case: Delta Lake column names are case-insensitive (``Score`` is ``score``).
    """
    return f"data_{name}" if name.lower() in _RESERVED_LOWER else name


COMPARISON_SCHEMA = pa.schema(
    [
        pa.field("comparison_id", pa.string(), nullable=False),
        pa.field("current_run_id", pa.string(), nullable=False),
        pa.field("baseline_run_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string()),
        pa.field("metric", pa.string()),
        pa.field("segment_column", pa.string()),
        pa.field("segment_value", pa.string()),
        pa.field("verdict", pa.string(), nullable=False),
        pa.field("like_for_like", pa.bool_()),
        pa.field("reason", pa.string()),
        pa.field("n_paired", pa.int64()),
        pa.field("n_added", pa.int64()),
        pa.field("n_removed", pa.int64()),
        pa.field("n_unpaired_unscored", pa.int64()),
        pa.field("mean_current", pa.float64()),
        pa.field("mean_baseline", pa.float64()),
        pa.field("mean_delta", pa.float64()),
        pa.field("ci_low", pa.float64()),
        pa.field("ci_high", pa.float64()),
        pa.field("flips_pass_to_fail", pa.int64()),
        pa.field("flips_fail_to_pass", pa.int64()),
        pa.field("mcnemar_p", pa.float64()),
        pa.field("context_precision_delta", pa.float64()),
        pa.field("tolerance", pa.float64()),
        pa.field("alpha", pa.float64()),
        pa.field("compared_at", pa.timestamp("us", tz="UTC")),
        pa.field("judge_drift", pa.bool_()),
    ]
)
"""Schema of the ``comparisons`` table: one overall row (segment columns null) plus one per segment value."""

#: One canary row's unit counts (``--canary``): human verdict x judge verdict, positive = supported.
CANARY_ROW_TYPE = pa.struct(
    [("key", pa.string()), ("tp", pa.int32()), ("fn", pa.int32()), ("fp", pa.int32()), ("tn", pa.int32())]
)

#: The ``runs`` columns of a run's canary (``--canary``), on its overall row only (null without a canary, on
#: segment rows, and in runs written before they existed). See docs/regression.md, "The canary".
CANARY_FIELDS: list[pa.Field] = [
    pa.field("canary_id", pa.string()),
    pa.field("canary_uri", pa.string()),
    pa.field("canary_rows", pa.int64()),
    pa.field("canary_units", pa.int64()),
    pa.field("canary_cached", pa.int64()),
    pa.field("canary_errors", pa.int64()),
    pa.field("canary_accuracy", pa.float64()),
    pa.field("canary_accuracy_low", pa.float64()),
    pa.field("canary_accuracy_high", pa.float64()),
    pa.field("canary_kappa", pa.float64()),
    pa.field("canary_kappa_low", pa.float64()),
    pa.field("canary_kappa_high", pa.float64()),
    pa.field("canary_tpr", pa.float64()),
    pa.field("canary_tnr", pa.float64()),
    pa.field("canary_requests", pa.int64()),
    pa.field("canary_cost_usd", pa.float64()),
    pa.field("canary_detail", pa.list_(CANARY_ROW_TYPE)),
]

#: The ``runs`` columns of the id metrics (issue 41), appended last (null in runs written before them, and in runs
#: without ids): the metric that decides the run's verdict, the rows the id metrics assessed, and per id metric
#: (``"recall@10"``) the mean over those rows with its 95 % interval.
ID_RUN_FIELDS: list[pa.Field] = [
    pa.field("verdict_metric", pa.string()),
    pa.field("id_rows", pa.int64()),
    pa.field("id_metrics", pa.map_(pa.string(), pa.float64())),
    pa.field("id_metrics_low", pa.map_(pa.string(), pa.float64())),
    pa.field("id_metrics_high", pa.map_(pa.string(), pa.float64())),
]

RUN_FIELDS: list[pa.Field] = [
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("flow_run_id", pa.string()),
    pa.field("started_at", pa.timestamp("us", tz="UTC")),
    pa.field("finished_at", pa.timestamp("us", tz="UTC")),
    pa.field("dataset", pa.string()),
    pa.field("run_date", pa.string()),
    pa.field("dataset_uri", pa.string()),
    pa.field("dataset_fingerprint", pa.string()),
    pa.field("label", pa.string()),
    pa.field("index_version", pa.string()),
    pa.field("metric", pa.string()),
    pa.field("judge_model", pa.string()),
    pa.field("prompt_version", pa.string()),
    pa.field("threshold", pa.float64()),
    pa.field("scale", pa.float64()),
    pa.field("segment_column", pa.string()),
    pa.field("segment_value", pa.string()),
    pa.field("rows", pa.int64()),
    pa.field("scored", pa.int64()),
    pa.field("errors", pa.int64()),
    pa.field("skipped", pa.int64()),
    pa.field("cached", pa.int64()),
    pa.field("mean_score", pa.float64()),
    pa.field("median_score", pa.float64()),
    pa.field("p10_score", pa.float64()),
    pa.field("ci_low", pa.float64()),
    pa.field("ci_high", pa.float64()),
    pa.field("pass_rate", pa.float64()),
    pa.field("prompt_tokens", pa.int64()),
    pa.field("completion_tokens", pa.int64()),
    pa.field("requests", pa.int64()),
    pa.field("cost_usd", pa.float64()),
    pa.field("mean_context_precision", pa.float64()),
    pa.field("chunk_use_rate", pa.float64()),
    pa.field("wall_seconds", pa.float64()),
    pa.field("status", pa.string()),
    pa.field("status_reason", pa.string()),
    pa.field("error_rate", pa.float64()),
    pa.field("max_error_rate", pa.float64()),
    pa.field("top_error", pa.string()),
    pa.field("top_error_count", pa.int64()),
    pa.field("judge", pa.string()),
    pa.field("units", pa.string()),
    pa.field("schema_version", pa.string()),
    pa.field("splitter_version", pa.string()),
    pa.field("judge_config", pa.string()),
    pa.field("row_identity", pa.string()),
    pa.field("dataset_id", pa.string()),
    pa.field("batch_ids", pa.list_(pa.string())),
    pa.field("batch_wait_s", pa.float64()),
    pa.field("reply_models", pa.list_(pa.string())),
    pa.field("substituted_rows", pa.int64()),
    *CANARY_FIELDS,
    # the last column: older tables evolve by appending it (null in runs written before it)
    pa.field("not_judged", pa.int64()),
    *ID_RUN_FIELDS,
]
RUN_SCHEMA = pa.schema(RUN_FIELDS)
"""Schema of the ``runs`` table: one row per run (``segment_column`` null) plus one per segment value.

``batch_ids`` and ``batch_wait_s`` are set by a ``--batch`` run that submitted batches (null for live runs and for
runs written before the columns existed: Delta merges the schema on append, the parquet reader unifies the files'
schemas). ``batch_ids`` is a ``list<string>`` rather than a comma-joined string: DuckDB (``list_contains``,
``unnest``) and Athena/Trino (``contains``, ``CROSS JOIN UNNEST``) query an array natively, with no string
splitting; ``batch_wait_s`` is the seconds from the first batch's submission to the collect (the resubmission
included), as wall-clock time across the submitting and collecting processes.

``not_judged``: rows a budget (``--max-requests`` / ``--max-cost-usd``) or the circuit breaker kept from the judge,
recorded with no score and the reason ``not judged: …``; ``skipped`` counts only the rows ``--on-missing skip`` did
not assess. Null in runs written before the column existed (their ``skipped`` counted both)."""

DISAGREEMENT_TYPE = pa.struct(
    [
        ("row_key", pa.string()),
        ("category", pa.string()),
        ("task", pa.string()),
        ("unit", pa.string()),
        ("human", pa.bool_()),
        ("judge", pa.bool_()),
        ("reason", pa.string()),
    ]
)

#: The agreement figures of a calibration, each stored as ``<figure>``, ``<figure>_low``, ``<figure>_high``.
CALIBRATION_FIGURES = ("accuracy", "kappa", "tpr", "tnr", "mae", "spearman")

CALIBRATION_FIELDS: list[pa.Field] = [
    pa.field("calibration_id", pa.string(), nullable=False),
    pa.field("calibrated_at", pa.timestamp("us", tz="UTC")),
    pa.field("dataset", pa.string()),
    pa.field("labels_uri", pa.string()),
    pa.field("labels_fingerprint", pa.string()),
    pa.field("judge", pa.string()),
    pa.field("judge_model", pa.string()),
    pa.field("prompt_version", pa.string()),
    pa.field("judge_config", pa.string()),
    pa.field("metric", pa.string()),
    pa.field("segment_column", pa.string()),
    pa.field("segment_value", pa.string()),
    pa.field("status", pa.string()),
    pa.field("rows", pa.int64()),
    pa.field("judged_rows", pa.int64()),
    pa.field("errors", pa.int64()),
    pa.field("units", pa.int64()),
    pa.field("tp", pa.int64()),
    pa.field("fn", pa.int64()),
    pa.field("fp", pa.int64()),
    pa.field("tn", pa.int64()),
    *(pa.field(f"{name}{suffix}", pa.float64()) for name in CALIBRATION_FIGURES for suffix in ("", "_low", "_high")),
    pa.field("undefined", pa.string()),
    pa.field("resamples", pa.int64()),
    pa.field("seed", pa.int64()),
    pa.field("requests", pa.int64()),
    pa.field("prompt_tokens", pa.int64()),
    pa.field("completion_tokens", pa.int64()),
    pa.field("cost_usd", pa.float64()),
    pa.field("cached", pa.int64()),
    pa.field("disagreements", pa.list_(DISAGREEMENT_TYPE)),
    pa.field("recall_bench_version", pa.string()),
]
CALIBRATION_SCHEMA = pa.schema(CALIBRATION_FIELDS)
"""Schema of the ``calibrations`` table (``recall-bench calibrate``): per calibration and judge, one overall row
(``segment_column`` null) plus one per task and per category. ``undefined``: the figures left null and why
(``kappa: undefined: every human label is supported``; ``; ``-separated). ``disagreements`` (overall rows only):
each unit where the judge and the human label differ, with the judge's reason."""
