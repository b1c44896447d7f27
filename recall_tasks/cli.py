"""``recall-bench``: run a benchmark, run the bundled demo, query the result tables."""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from recall_tasks import events
from recall_tasks.errors import RecallBenchError, RegressionDetected, RunFailed
from recall_tasks.secrets import looks_secret, redact
from recall_tasks.storage import parse_storage_options

EXIT_CODES = """Exit codes of run: 0 completed; 2 usage, configuration or dataset error (nothing written, no run
recorded); 3 regressed against the baseline with --fail-on-regression; 4 the run failed (rows committed with
status failed: error rate above --max-error-rate, or judging stopped by an outage); 130 interrupted (143 on
SIGTERM)."""

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Contextual recall of retrieval systems.",
    epilog=EXIT_CODES,
)
console = Console()
err = Console(stderr=True, soft_wrap=True)

_SECRET_ENV = {
    "aws_access_key_id": "AWS_ACCESS_KEY_ID",
    "access_key_id": "AWS_ACCESS_KEY_ID",
    "key": "AWS_ACCESS_KEY_ID",
    "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "secret": "AWS_SECRET_ACCESS_KEY",
    "aws_session_token": "AWS_SESSION_TOKEN",
    "token": "AWS_SESSION_TOKEN",
}


def _split_storage_options(pairs: list[str]) -> dict[str, str]:
    """Non-secret options become run parameters; credentials go to this process's AWS_* variables only."""
    plain: dict[str, str] = {}
    for key, value in parse_storage_options(pairs).items():
        if looks_secret(key):
            env = _SECRET_ENV.get(key.lower())
            if env is None:
                raise typer.BadParameter(f"--storage-option {key}: unknown credential option; use AWS_* variables")
            os.environ[env] = value
        else:
            plain[key] = value
    return plain


def _fail(exc: BaseException) -> NoReturn:
    err.print("[bold red]error:[/]", escape(redact(str(exc))), soft_wrap=True)
    raise typer.Exit(code=2)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(map(str, e["loc"]))
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def _print_summary(summary: dict[str, Any], output: str) -> None:
    from recall_tasks.report import summary_rows

    table = Table(title=f"run {summary['run_id']}", show_header=False)
    for row in summary_rows(summary):
        table.add_row(row["field"], row["value"])
    console.print(table)
    query = "SELECT row_id, score, reason FROM results ORDER BY score LIMIT 5"
    console.print(f'\nQuery the tables:\n  recall-bench query "{query}" --output {output}')
    if summary.get("report_uri"):
        console.print(f"HTML report: {summary['report_uri']}")


def _run(params: Any) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from flows.recall_flow import recall_benchmark
    from recall_tasks import pipeline

    with Progress(
        TextColumn("scoring"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as progress:
        bar = progress.add_task("rows", total=None)

        def listener(done: int, total: int) -> None:
            progress.update(bar, completed=done, total=total)

        pipeline.add_progress_listener(listener)
        try:
            return recall_benchmark(params)
        finally:
            pipeline.remove_progress_listener(listener)


@app.command()
def run(
    dataset_uri: Annotated[str, typer.Argument(help="Parquet file, folder or glob (s3://, gs://, az://, path)")],
    output: Annotated[str, typer.Option("--output", "-o", help="Output location for results/ and runs/")],
    metric: Annotated[str, typer.Option(help="contextual_recall | context_coverage")] = "contextual_recall",
    judge: Annotated[str, typer.Option(help="openai | lexical")] = "lexical",
    model: Annotated[str, typer.Option(help="Judge model")] = "gpt-4o-mini",
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint")] = None,
    threshold: float = 0.5,
    scale: float = 1.0,
    strict: Annotated[
        bool, typer.Option("--strict", help="Score is scale only if every sentence is supported")
    ] = False,
    on_missing: Annotated[str, typer.Option(help="error | zero | skip")] = "error",
    max_concurrency: int = 64,
    chunk_size: int = 500,
    timeout_s: Annotated[
        float, typer.Option("--timeout-s", help="Seconds a judge call may take per attempt before it is retried")
    ] = 60.0,
    max_retries: Annotated[
        int, typer.Option("--max-retries", help="Retries of a judge call on 429, 5xx, timeouts, connection errors")
    ] = 4,
    label: Annotated[str | None, typer.Option(help="Label of the run, e.g. the index version")] = None,
    dataset_name: Annotated[
        str | None,
        typer.Option(help="Series name of the dataset (default: its location); set it for dated folders"),
    ] = None,
    segment_by: Annotated[list[str] | None, typer.Option("--segment-by", help="Column to aggregate by")] = None,
    column: Annotated[list[str] | None, typer.Option("--column", help="role=name column mapping")] = None,
    format: Annotated[str, typer.Option("--format", help="delta | parquet")] = "delta",
    storage_option: Annotated[list[str] | None, typer.Option("--storage-option", help="key=value")] = None,
    cache: Annotated[bool, typer.Option("--cache/--no-cache", help="Read and write the verdict caches")] = True,
    refresh_cache: Annotated[bool, typer.Option("--refresh-cache", help="Re-judge, then refresh caches")] = False,
    cache_uri: Annotated[str | None, typer.Option(help="Row cache location (default <output>/cache)")] = None,
    chunk_cache_storage: Annotated[str | None, typer.Option(help="Prefect result storage for chunk cache")] = None,
    max_cost_usd: Annotated[float | None, typer.Option(help="Stop judging once this much is spent")] = None,
    max_requests: Annotated[int | None, typer.Option(help="Stop judging after this many requests")] = None,
    max_error_rate: Annotated[
        float, typer.Option(help="Share of assessed rows in error above which the run fails (exit 4)")
    ] = 0.05,
    index_version: Annotated[str | None, typer.Option(help="Version of the search index being scored")] = None,
    baseline: Annotated[str, typer.Option(help="latest | RUN_ID | label:LABEL | none")] = "latest",
    tolerance: Annotated[float, typer.Option(help="Mean drop counted as a regression")] = 0.02,
    fail_on_regression: Annotated[bool, typer.Option("--fail-on-regression", help="Exit 3 on regression")] = False,
    retriever: Annotated[str | None, typer.Option(help="module:function filling contexts at run time")] = None,
    retrieval_uri: Annotated[str | None, typer.Option(help="Parquet of row_id + contexts from a new index")] = None,
) -> None:
    """Score a dataset and commit results and run aggregates."""
    from recall_tasks.config import RunParams
    from recall_tasks.datasets import parse_column_overrides

    try:
        params = RunParams.model_validate(
            {
                "dataset_uri": dataset_uri,
                "output_uri": output,
                "metric": metric,
                "judge": judge,
                "model": model,
                "base_url": base_url,
                "threshold": threshold,
                "scale": scale,
                "strict_mode": strict,
                "on_missing": on_missing,
                "max_concurrency": max_concurrency,
                "chunk_size": chunk_size,
                "timeout_s": timeout_s,
                "max_retries": max_retries,
                "label": label,
                "dataset_name": dataset_name,
                "segment_by": segment_by or [],
                "columns": parse_column_overrides(column or []),
                "format": format,
                "storage_options": _split_storage_options(storage_option or []),
                "cache": cache,
                "refresh_cache": refresh_cache,
                "cache_uri": cache_uri,
                "chunk_cache_storage": chunk_cache_storage,
                "max_cost_usd": max_cost_usd,
                "max_requests": max_requests,
                "max_error_rate": max_error_rate,
                "index_version": index_version,
                "baseline": None if baseline.lower() == "none" else baseline,
                "tolerance": tolerance,
                "fail_on_regression": fail_on_regression,
                "retriever": retriever,
                "retrieval_uri": retrieval_uri,
            }
        )
        for note in _preflight(params):
            err.print(f"[yellow]note:[/] {escape(redact(note))}")
        summary = _run(params)
    except RegressionDetected as exc:
        _print_outcome(exc.summary, output)
        err.print(f"[bold red]regression:[/] {escape(redact(str(exc)))}")
        raise typer.Exit(code=3) from None
    except RunFailed as exc:
        _print_outcome(exc.summary, output)
        err.print(f"[bold red]run failed:[/] {escape(redact(str(exc)))}")
        raise typer.Exit(code=4) from None
    except ValidationError as exc:
        _fail(ValueError(_validation_message(exc)))
    except RecallBenchError as exc:
        _fail(exc)
    _print_outcome(summary, output)


def _preflight(params: Any) -> list[str]:
    """The run's checks before Prefect starts (the flow repeats them for deployments); returns notes."""
    from recall_tasks import pipeline

    return pipeline.preflight(params)


def verdict_line(comparison: dict[str, Any]) -> str:
    """``vs baseline X: regressed (mean delta -0.0867, 95 % CI -0.12..-0.05, 21 pass->fail / 0 fail->pass,
    300 paired)``, or the reason a comparison is incomparable."""
    head = f"vs baseline {comparison['baseline_run_id']}: {comparison['verdict']}"
    if comparison.get("verdict") == "incomparable":
        return f"{head} ({comparison.get('reason')})"
    parts = []
    if comparison.get("mean_delta") is not None:
        parts.append(f"mean delta {comparison['mean_delta']:+.4f}")
    lo, hi = (comparison.get("ci") or [None, None])[:2]
    if lo is not None and hi is not None:
        parts.append(f"95 % CI {lo:+.4f}..{hi:+.4f}")
    flips = comparison.get("flips") or {}
    parts.append(f"{flips.get('pass_to_fail', 0)} pass->fail / {flips.get('fail_to_pass', 0)} fail->pass")
    parts.append(f"{comparison.get('n_paired', 0)} paired")
    return f"{head} ({', '.join(parts)})"


def _print_outcome(summary: dict[str, Any], output: str) -> None:
    """Summary table, verdict line, report path and warnings: printed for every committed run (exit 0, 3, 4)."""
    if not summary:
        return
    _print_summary(summary, output)
    comparison = summary.get("comparison")
    if comparison:
        console.print(escape(verdict_line(comparison)), soft_wrap=True)
        for warning in comparison.get("warnings") or []:
            err.print(f"[yellow]warning:[/] {escape(redact(str(warning)))}", soft_wrap=True)
    elif summary.get("status") == "failed":
        console.print("not compared with a baseline: a failed run is never compared nor used as a baseline")
    else:
        console.print("first run of its series: no baseline to compare with")
    if summary.get("top_error"):
        err.print(
            f"[yellow]{summary['errors']} row(s) ended with an error; most common ({summary['top_error_count']} "
            f"rows): {escape(redact(str(summary['top_error'])))}[/]"
        )
    if summary.get("status") == "budget_exhausted":
        err.print(f"[yellow]judging stopped early: {escape(summary['status_reason'])}; rows not judged are marked[/]")


@app.command()
def demo(output: Annotated[str, typer.Option("--output", "-o")] = "recall-output") -> None:
    """Score the bundled sample dataset with the offline judge, end to end through Prefect."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recall_tasks.config import RunParams

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
    params = RunParams(
        dataset_uri=str(path),
        output_uri=output,
        judge="lexical",
        label="demo",
        on_missing="skip",
        segment_by=["category"],
        chunk_size=4,
    )
    try:
        summary = _run(params)
    except RecallBenchError as exc:
        _fail(exc)
    _print_summary(summary, output)
    console.print("\nThe five rows with the least supported ground truth:")
    query(
        "SELECT row_id, category, score, reason FROM results ORDER BY score NULLS FIRST LIMIT 5",
        output=output,
        format="delta",
        storage_option=None,
        limit=5,
    )


@app.command()
def query(
    sql: Annotated[str, typer.Argument(help="SQL over the tables `results`, `runs` and `comparisons`")],
    output: Annotated[str, typer.Option("--output", "-o")] = "recall-output",
    format: Annotated[str, typer.Option("--format")] = "delta",
    storage_option: Annotated[list[str] | None, typer.Option("--storage-option")] = None,
    limit: int = 50,
) -> None:
    """Run DuckDB SQL over the result tables and print the answer."""
    import duckdb

    try:
        store = _store(output, format, storage_option)
        con = duckdb.connect()
        for name in ("results", "runs", "comparisons"):
            ds = store.read_table(name)
            if ds is not None:
                con.register(name, ds)
        rel = con.sql(sql)
    except RecallBenchError as exc:
        _fail(exc)
    except duckdb.Error as exc:
        _fail(ValueError(f"query failed: {exc}"))
    if rel is None:
        return
    table = Table(*rel.columns)
    for row in rel.limit(limit).fetchall():
        table.add_row(*("" if v is None else str(v) for v in row))
    console.print(table)


def _store(output: str, format: str, storage_option: list[str] | None) -> Any:
    from recall_tasks.results import ResultStore
    from recall_tasks.storage import StorageConfig

    return ResultStore(output, StorageConfig.from_options(_split_storage_options(storage_option or [])), format)  # type: ignore[arg-type]


@app.command()
def history(
    output: Annotated[str, typer.Option("--output", "-o")] = "recall-output",
    dataset: Annotated[str | None, typer.Option(help="Only this dataset")] = None,
    format: Annotated[str, typer.Option("--format")] = "delta",
    storage_option: Annotated[list[str] | None, typer.Option("--storage-option")] = None,
    limit: int = 30,
) -> None:
    """The series of runs: mean with its 95 % CI, pass rate, and the verdict against each run's baseline."""
    import pyarrow.compute as pc

    try:
        store = _store(output, format, storage_option)
        runs_ds = store.read_table("runs")
        comparisons_ds = store.read_table("comparisons")
    except RecallBenchError as exc:
        _fail(exc)
    if runs_ds is None:
        _fail(ValueError(f"no runs recorded under {output}"))
    runs = runs_ds.to_table()
    runs = runs.filter(pc.is_null(runs.column("segment_column")))
    if dataset:
        runs = runs.filter(pc.equal(runs.column("dataset"), dataset))
    verdicts: dict[str, str] = {}
    if comparisons_ds is not None:
        comps = comparisons_ds.to_table(columns=["current_run_id", "segment_column", "verdict", "baseline_run_id"])
        for c in comps.to_pylist():
            if c["segment_column"] is None:
                verdicts[c["current_run_id"]] = f"{c['verdict']} vs {c['baseline_run_id']}"
    rows = sorted(runs.to_pylist(), key=lambda r: r["started_at"])[-limit:]
    table = Table("started", "dataset", "label", "run_id", "rows", "mean", "95 % CI", "pass rate", "verdict")
    for r in rows:
        ci = "-" if r["ci_low"] is None else f"{r['ci_low']:.3f}..{r['ci_high']:.3f}"
        mean = "-" if r["mean_score"] is None else f"{r['mean_score']:.3f}"
        rate = "-" if r["pass_rate"] is None else f"{r['pass_rate']:.1%}"
        table.add_row(
            r["started_at"].strftime("%Y-%m-%d %H:%M"),
            r["dataset"],
            r["label"] or "",
            r["run_id"],
            str(r["rows"]),
            mean,
            ci,
            rate,
            verdicts.get(r["run_id"], "first of series"),
        )
    console.print(table)


@app.command()
def report(
    run_id: Annotated[str, typer.Argument(help="The run to report on")],
    output: Annotated[str, typer.Option("--output", "-o")] = "recall-output",
    format: Annotated[str, typer.Option("--format")] = "delta",
    storage_option: Annotated[list[str] | None, typer.Option("--storage-option")] = None,
) -> None:
    """Write a self-contained HTML report of a run next to the tables and print where it is."""
    from recall_tasks.html_report import write_report

    try:
        uri = write_report(_store(output, format, storage_option), run_id)
    except RecallBenchError as exc:
        _fail(exc)
    console.print(uri)


events.register(app)
