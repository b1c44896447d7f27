"""``recall-bench``: the Typer app and the commands that run the benchmark flow, ``run`` and ``demo``.

``run`` turns its options into ``RunParams`` (every default and help text is the model's); running the flow,
the outcome and the exit codes are :mod:`recall_tasks.cli.run_flow`, which ``batch collect`` uses too.
The other commands are plain functions in modules by concern, registered at the bottom in ``--help`` order:
``tables`` (query, history), ``report``, ``server_cmd`` (the ``server`` group), ``batch``, ``alerts_cmd`` (the
``alerts`` group), then ``emit-index-built``
(``pipeline/events.py``). What every command shares (consoles, options, one-line errors, the result store) is in
``common``; a run's process handling (Prefect API, signals, quiet console logging) in ``runtime``.
"""

from __future__ import annotations

import gc
import json
import os
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import typer

from recall_tasks._logging import inert
from recall_tasks.cli import calibrate_cmd, maintain, report, server_cmd, tables
from recall_tasks.cli.alerts_cmd import alerts_app
from recall_tasks.cli.batch import batch_app
from recall_tasks.cli.common import (
    DEBUG_HELP,
    DEFAULT_OUTPUT,
    FormatOption,
    OutputOption,
    StorageOption,
    _detect_format,
    _split_storage_options,
    _store,
    console,
    err,
)
from recall_tasks.cli.outcome import judge_line_of, print_summary
from recall_tasks.cli.run_flow import _run, execute, one_line_errors
from recall_tasks.cli.tables import _print_query
from recall_tasks.config import RunParams
from recall_tasks.pipeline import events

#: ``\b`` keeps click from re-flowing the lines: each fits 80 columns (tests/test_help.py checks it)
EXIT_CODES = """\b
Exit codes of run and batch collect:
  0    completed; or a --batch run is pending, or had nothing to collect
  2    a usage, configuration or dataset error (nothing written, no run
       recorded); or the same run is in progress elsewhere (see
       --wait-for-lock)
  3    regressed against the baseline with --fail-on-regression
  4    the run failed: rows committed with status failed (errors above
       --max-error-rate, or an outage stopped judging); or a worker process
       died: nothing committed, rerun to resume
  5    stopped by --max-requests or --max-cost-usd: rows committed with
       status budget_exhausted, the rest counted not_judged
  6    incomparable to its baseline (judge drift or a changed configuration)
       with --fail-on-regression, unless --allow-incomparable
  7    no baseline to compare with (the first run of its series, or every
       earlier run failed) with --require-baseline
  130  interrupted (143 on SIGTERM)
When several apply, the code is the first of 4, 5, 3, 6, 7. A Prefect flow
run ends Failed for 3, 4, 5, 6 and 7."""


app = typer.Typer(
    add_completion=False,
    rich_markup_mode=None,
    no_args_is_help=True,
    help="Contextual recall of retrieval systems.",
    epilog=EXIT_CODES,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"recall-bench {version('recall-bench')}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit")
    ] = False,
) -> None:
    """Contextual recall of retrieval systems."""


RUN_FIELDS = RunParams.model_fields


def _field(name: str) -> Any:
    """The default of a ``RunParams`` field: every default of ``run`` lives in the model, once."""
    return RUN_FIELDS[name].default


def _opt(name: str, *decls: str, **kw: Any) -> Any:
    """A ``run`` option for a ``RunParams`` field: its help text is the field's description."""
    return typer.Option(*decls, help=RUN_FIELDS[name].description, **kw)


@app.command(epilog=EXIT_CODES)
def run(
    dataset_uri: Annotated[str, typer.Argument(help=RUN_FIELDS["dataset_uri"].description)],
    output: OutputOption = DEFAULT_OUTPUT,
    metric: Annotated[str, _opt("metric")] = _field("metric"),
    judge: Annotated[str, _opt("judge")] = _field("judge"),
    model: Annotated[str, _opt("model")] = _field("model"),
    base_url: Annotated[str | None, _opt("base_url")] = _field("base_url"),
    threshold: Annotated[float, _opt("threshold")] = _field("threshold"),
    scale: Annotated[float, _opt("scale")] = _field("scale"),
    strict: Annotated[bool, _opt("strict_mode", "--strict")] = _field("strict_mode"),
    reason: Annotated[bool, _opt("include_reason", "--reason/--no-reason")] = _field("include_reason"),
    on_missing: Annotated[str, _opt("on_missing")] = _field("on_missing"),
    max_concurrency: Annotated[int, _opt("max_concurrency")] = _field("max_concurrency"),
    rpm: Annotated[int | None, _opt("requests_per_minute", "--rpm")] = _field("requests_per_minute"),
    tpm: Annotated[int | None, _opt("tokens_per_minute", "--tpm")] = _field("tokens_per_minute"),
    rate_limit_key: Annotated[str | None, _opt("rate_limit_key")] = _field("rate_limit_key"),
    chunk_size: Annotated[int, _opt("chunk_size")] = _field("chunk_size"),
    max_workers: Annotated[int, _opt("max_workers")] = _field("max_workers"),
    timeout_s: Annotated[float, _opt("timeout_s", "--timeout-s")] = _field("timeout_s"),
    max_retries: Annotated[int, _opt("max_retries")] = _field("max_retries"),
    context_window: Annotated[int | None, _opt("context_window", metavar="TOKENS")] = _field("context_window"),
    on_overlong: Annotated[str, _opt("on_overlong")] = _field("on_overlong"),
    label: Annotated[str | None, _opt("label")] = _field("label"),
    dataset_name: Annotated[str | None, _opt("dataset_name")] = _field("dataset_name"),
    segment_by: Annotated[list[str] | None, _opt("segment_by", "--segment-by")] = None,
    column: Annotated[list[str] | None, typer.Option("--column", help="role=name column mapping (repeatable)")] = None,
    format: FormatOption = None,
    catalog: Annotated[str | None, _opt("catalog")] = _field("catalog"),
    namespace: Annotated[str | None, _opt("namespace")] = _field("namespace"),
    storage_option: StorageOption = None,
    cache: Annotated[bool, _opt("cache", "--cache/--no-cache")] = _field("cache"),
    refresh_cache: Annotated[bool, _opt("refresh_cache", "--refresh-cache")] = _field("refresh_cache"),
    cache_uri: Annotated[str | None, _opt("cache_uri")] = _field("cache_uri"),
    max_cost_usd: Annotated[float | None, _opt("max_cost_usd")] = _field("max_cost_usd"),
    price: Annotated[list[str] | None, _opt("prices", "--price")] = None,
    max_requests: Annotated[int | None, _opt("max_requests")] = _field("max_requests"),
    max_error_rate: Annotated[float, _opt("max_error_rate")] = _field("max_error_rate"),
    index_version: Annotated[str | None, _opt("index_version")] = _field("index_version"),
    baseline: Annotated[str, typer.Option(help="latest | RUN_ID | label:LABEL | none (no comparison)")] = _field(
        "baseline"
    ),
    tolerance: Annotated[float, _opt("tolerance")] = _field("tolerance"),
    canary: Annotated[str | None, _opt("canary", metavar="LABELS")] = _field("canary"),
    fail_on_regression: Annotated[bool, _opt("fail_on_regression", "--fail-on-regression")] = _field(
        "fail_on_regression"
    ),
    allow_incomparable: Annotated[bool, _opt("allow_incomparable", "--allow-incomparable")] = _field(
        "allow_incomparable"
    ),
    require_baseline: Annotated[bool, _opt("require_baseline", "--require-baseline")] = _field("require_baseline"),
    retriever: Annotated[str | None, _opt("retriever")] = _field("retriever"),
    retrieval_uri: Annotated[str | None, _opt("retrieval_uri")] = _field("retrieval_uri"),
    k: Annotated[str, _opt("k", "--k")] = _field("k"),
    id_pattern: Annotated[str | None, _opt("id_pattern", metavar="REGEX")] = _field("id_pattern"),
    qrels_uri: Annotated[str | None, _opt("qrels_uri", "--qrels", metavar="URI")] = _field("qrels_uri"),
    verdict_metric: Annotated[str, _opt("verdict_metric")] = _field("verdict_metric"),
    units: Annotated[str, _opt("units")] = _field("units"),
    extractor_model: Annotated[str | None, _opt("extractor_model")] = _field("extractor_model"),
    context_from: Annotated[str | None, _opt("context_from")] = _field("context_from"),
    context_extractor: Annotated[str | None, _opt("context_extractor")] = _field("context_extractor"),
    task_runner: Annotated[str, _opt("task_runner")] = _field("task_runner"),
    workers: Annotated[int | None, _opt("workers")] = _field("workers"),
    dask_address: Annotated[str | None, _opt("dask_address")] = _field("dask_address"),
    batch: Annotated[bool, _opt("batch", "--batch")] = _field("batch"),
    wait: Annotated[bool, _opt("batch_wait", "--wait")] = _field("batch_wait"),
    poll_interval: Annotated[float, _opt("poll_interval_s", "--poll-interval")] = _field("poll_interval_s"),
    batch_timeout: Annotated[float | None, _opt("batch_timeout_s", "--batch-timeout")] = _field("batch_timeout_s"),
    batch_fallback: Annotated[str, _opt("batch_fallback")] = _field("batch_fallback"),
    collect_only: Annotated[bool, _opt("batch_collect_only", "--collect-only")] = _field("batch_collect_only"),
    wait_for_lock: Annotated[bool, _opt("wait_for_lock", "--wait-for-lock")] = _field("wait_for_lock"),
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print the rows the judge would get, their estimated tokens and cost (live and batch) and the "
            "limit that would stop the run; no judge call, nothing written",
        ),
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
) -> None:
    """Score a dataset and commit results and run aggregates."""
    from recall_tasks.io.columns import parse_column_overrides

    with one_line_errors(debug):
        params = RunParams.model_validate(
            {
                "dataset_uri": dataset_uri, "output_uri": output, "metric": metric, "judge": judge, "model": model,
                "base_url": base_url, "threshold": threshold, "scale": scale, "strict_mode": strict,
                "include_reason": reason, "on_missing": on_missing, "max_concurrency": max_concurrency,
                "requests_per_minute": rpm, "tokens_per_minute": tpm, "rate_limit_key": rate_limit_key,
                "chunk_size": chunk_size,
                "max_workers": max_workers, "timeout_s": timeout_s, "max_retries": max_retries, "label": label,
                "context_window": context_window, "on_overlong": on_overlong,
                "dataset_name": dataset_name, "segment_by": segment_by or [],
                "columns": parse_column_overrides(column or []),
                "format": format or ("iceberg" if catalog else _detect_format(output, storage_option)),
                "catalog": catalog, "namespace": namespace,
                "storage_options": _split_storage_options(storage_option or []), "cache": cache,
                "refresh_cache": refresh_cache, "cache_uri": cache_uri,
                "max_cost_usd": max_cost_usd, "max_requests": max_requests,
                "prices": price or {},
                "max_error_rate": max_error_rate, "index_version": index_version,
                "baseline": None if baseline.lower() == "none" else baseline, "tolerance": tolerance,
                "canary": canary,
                "fail_on_regression": fail_on_regression, "allow_incomparable": allow_incomparable,
                "require_baseline": require_baseline,
                "retriever": retriever, "retrieval_uri": retrieval_uri, "k": k, "id_pattern": id_pattern,
                "qrels_uri": qrels_uri, "verdict_metric": verdict_metric,
                "units": units, "extractor_model": extractor_model, "context_from": context_from,
                "context_extractor": context_extractor,
                "task_runner": task_runner, "workers": workers, "dask_address": dask_address,
                "batch": batch, "batch_wait": wait, "poll_interval_s": poll_interval,
                "batch_timeout_s": batch_timeout, "batch_fallback": batch_fallback,
                "batch_collect_only": collect_only, "wait_for_lock": wait_for_lock,
            }
        )  # fmt: skip
        from recall_tasks.pipeline.dask_paths import absolute

        params = absolute(params)  # --dask-address: relative paths are this folder's, not the workers'
        if dry_run:
            from recall_tasks.pipeline.estimate import estimate, report

            for line in report(params, estimate(params)):
                console.print(inert(line), markup=False, highlight=False, soft_wrap=True)
            return
    execute(params, output, debug)


@app.command()
def demo(
    output: OutputOption = DEFAULT_OUTPUT,
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
    regression: Annotated[
        bool,
        typer.Option(
            "--regression", help="Score two index versions of the sample (v2 lost chunks) and show the regression"
        ),
    ] = False,
) -> None:
    """Score the bundled sample with the offline judge.

    End to end: the sample goes through the same Prefect flow as a run, with no key and no server to start by hand.
    With --regression: index v1, then an index v2 that lost chunks, compared (regressed).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        json.loads(line)
        for line in resources.files("recall_tasks").joinpath("data", "sample.jsonl").read_text("utf-8").splitlines()
        if line
    ]
    # the dataset lives beside the output, never inside it (an output containing its dataset is refused)
    out = Path(output).expanduser().resolve()
    data_dir = out.parent / f"{out.name}-demo-data"
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "sample.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    if regression:
        from recall_tasks.cli.demo_regression import run_two_index_versions

        lexical = RunParams(dataset_uri=str(path), output_uri=output, judge="lexical")
        err.print(judge_line_of(lexical), markup=False, highlight=False)
        with one_line_errors(debug):
            run_two_index_versions(path, rows, output, debug)
        return
    params = RunParams(
        dataset_uri=str(path),
        output_uri=output,
        judge="lexical",
        label="demo",
        on_missing="skip",
        segment_by=["category"],
        chunk_size=4,
    )
    err.print(judge_line_of(params), markup=False, highlight=False)
    with one_line_errors(debug):
        summary = _run(params, debug)
        if summary["status"] == "batch_pending" or summary["status"] == "batch_idle":  # the demo never batches
            raise RuntimeError(f"the demo run ended {summary['status']}")
        print_summary(summary, output)
        console.print("\nThe five least supported rows and their unsupported sentences:", soft_wrap=True)
        # this run's rows only (a second demo into one output must not list each row twice); ties broken by
        # row_id: the demo prints the same table every time (the README test compares it)
        worst = _DEMO_WORST_ROWS.format(run_id=summary["run_id"].replace("'", "''"))
        _print_query(_store(output, "delta", None), output, worst, limit=5, fmt="table")


_DEMO_WORST_ROWS = (
    "SELECT row_id, category, score, coalesce(nullif(array_to_string(list_transform("
    "list_filter(verdicts, lambda v: v.verdict <> 'yes'), lambda v: v.statement), ' / '), ''), reason) "
    "AS not_supported FROM results WHERE run_id = '{run_id}' ORDER BY score NULLS FIRST, row_id LIMIT 5"
)


# The commands defined elsewhere, after run and demo: --help lists them in this order.
app.command()(tables.query)
app.command()(tables.history)
app.command()(report.report)
app.command()(calibrate_cmd.calibrate)
app.command(epilog=maintain.MAINTAIN_EPILOG)(maintain.maintain)
app.add_typer(server_cmd.server_app, name="server")
app.add_typer(batch_app, name="batch")
app.add_typer(alerts_app, name="alerts")
events.register(app)


#: The collector's thresholds in the ``recall-bench`` process (young, middle, full), each at least this: a run's rows
#: in flight outlive two young collections, and CPython's ``(700, 10, 10)`` then ran a full collection over the
#: whole process about twice a second (docs/performance.md, "Garbage collection while a run judges").
CLI_GC_THRESHOLDS = (20_000, 10, 100)


def settle_process() -> None:
    """What the ``recall-bench`` process sets for itself, before its heavy imports; the library sets none of it
    (``import recall_tasks``, ``evaluate()`` and a deployment's flow leave their host's settings alone).

    - ``_RJEM_MALLOC_CONF`` (read by deltalake's own jemalloc at deltalake's first import): the pages the commit's
      Delta write freed go back to the system at once, not seconds later while the report allocates;
    - ``TOKIO_WORKER_THREADS=1`` (read by deltalake's runtime when it starts): with a worker per core its
      partitioned write of ``results`` queued the batches it had not encoded yet;
    - the collector's thresholds, :data:`CLI_GC_THRESHOLDS` (a higher one of the user's stays; 0 stays off).

    docs/performance.md ("1,000,000 rows", "Garbage collection while a run judges") has what each is worth.
    A setting the user made wins. Worker processes of ``--task-runner processes|dask`` inherit the environment.
    """
    os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")
    os.environ.setdefault("TOKIO_WORKER_THREADS", "1")
    found = gc.get_threshold()
    if found[0]:
        gc.set_threshold(*(max(a, b) for a, b in zip(found, CLI_GC_THRESHOLDS, strict=True)))


def console_main() -> None:
    """The ``recall-bench`` process: its own settings (:func:`settle_process`), the Typer app, its exit code.

    The exit is the interpreter's own (``sys.exit``: threads joined, exit handlers run, finalization), after a
    ``gc.freeze()``: the finalization's collections then skip every object the command made (all about to go),
    which they walked again one by one (~2 s after a 1,000-row run: docs/performance.md)."""
    import sys

    settle_process()
    code = _main(sys.argv[1:])
    gc.freeze()
    sys.exit(code)


def _main(args: list[str]) -> int:
    """The Typer app on ``args``; returns the exit code. A usage error is one line, as every other error:
    ``error: No such option: --concurrency (Possible options: --max-concurrency); see recall-bench run --help``,
    exit 2 (Typer's own rendering is a usage line, a hint and a boxed panel)."""
    try:
        rv = app(args, prog_name="recall-bench", standalone_mode=False)
    except typer.TyperException as exc:  # Typer's click errors: usage errors (exit 2) and the like
        if type(exc).__name__ == "NoArgsIsHelpError":  # `recall-bench` alone: the help, as before
            exc.show()  # type: ignore[attr-defined]
        else:
            ctx = getattr(exc, "ctx", None)
            message = exc.format_message()
            if ctx is not None:  # "…; see recall-bench run --help" (after a question: "…? See …")
                message = message.rstrip(".")
                message += f"{' S' if message.endswith('?') else '; s'}ee {ctx.command_path} --help"
            err.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
        return int(getattr(exc, "exit_code", 2))
    except typer.Abort:
        err.print("aborted", highlight=False)
        return 1
    return rv if isinstance(rv, int) else 0
