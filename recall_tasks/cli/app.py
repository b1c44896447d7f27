"""``recall-bench``: run a benchmark, run the bundled demo, query the result tables."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from recall_tasks.cli.batch import batch_app
from recall_tasks.cli.output import OUTPUT_FORMATS, OutputFormat
from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError, RecallBenchError, RegressionDetected, RunFailed
from recall_tasks.io.storage import parse_storage_options
from recall_tasks.pipeline import events
from recall_tasks.secrets import looks_secret, redact

EXIT_CODES = """Exit codes of run: 0 completed (or --batch pending); 2 usage, configuration or dataset error
(nothing written, no run recorded); 3 regressed against the baseline with --fail-on-regression; 4 the run failed
(rows committed with status failed: error rate above --max-error-rate, or judging stopped by an outage); 130
interrupted (143 on SIGTERM)."""

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Contextual recall of retrieval systems.",
    epilog=EXIT_CODES,
)
console = Console()
err = Console(stderr=True, soft_wrap=True)

DEFAULT_OUTPUT = RunParams.model_fields["output_uri"].default
"""Every command's ``--output`` default, unless the ``RECALL_OUTPUT`` environment variable is set."""

# Options shared by the commands that read or write an output: one default and one help text everywhere.
OutputOption = Annotated[
    str,
    typer.Option(
        "--output", "-o", envvar="RECALL_OUTPUT", help="Where the tables live: a path or s3://, gs://, az:// URI"
    ),
]
FormatOption = Annotated[
    str | None,
    typer.Option("--format", help="delta | parquet; default: what is at --output already, else delta"),
]
StorageOption = Annotated[
    list[str] | None,
    typer.Option("--storage-option", help="key=value for the object store (repeatable); secrets go to AWS_* vars"),
]
OutputFormatOption = Annotated[
    str, typer.Option("--output-format", help="table | csv | json (JSON lines, one object per row) | markdown")
]


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


def _output_format(value: str) -> OutputFormat:
    if value not in OUTPUT_FORMATS:
        _fail(ConfigError(f"--output-format must be one of {', '.join(OUTPUT_FORMATS)}, got {value!r}"))
    return value  # type: ignore[return-value]


def _print_notice(message: str | None) -> None:
    if message:
        err.print(message, markup=False, highlight=False)


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


def _fail(exc: BaseException, debug: bool = False) -> NoReturn:
    """One line, ``error: …``, exit 2; ``--debug`` prints the (redacted) traceback before it."""
    if debug and exc.__traceback__ is not None:
        err.print(escape(redact("".join(traceback.format_exception(exc)))), soft_wrap=True, highlight=False)
    err.print("[bold red]error:[/]", escape(redact(str(exc))), soft_wrap=True)
    raise typer.Exit(code=2)


def _fail_unexpected(exc: Exception, debug: bool) -> NoReturn:
    """An exception recall-bench did not raise on purpose (a bug, a library's error): still one line."""
    text = " ".join(str(exc).split())[:500] or "(no message)"
    hint = "" if debug else " (rerun with --debug for the traceback)"
    message = RuntimeError(f"{type(exc).__name__}: {text}{hint}")
    message.__traceback__ = exc.__traceback__
    _fail(message, debug)


DEBUG_HELP = "Show Prefect's logs and full tracebacks"


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(map(str, e["loc"]))
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def _print_summary(summary: dict[str, Any], output: str) -> None:
    """The run's summary table and where to look next; values are plain text (never markup), redacted."""
    from recall_tasks.cli.output import print_table
    from recall_tasks.reports.summary import summary_rows

    cells = [[row["field"], redact(row["value"])] for row in summary_rows(summary)]
    print_table(["field", "value"], cells, console, title=f"run {summary['run_id']}", show_header=False)
    query = "SELECT row_id, score, reason FROM results ORDER BY score LIMIT 5"
    console.print(Text(f'\nQuery the tables:\n  recall-bench query "{query}" --output {output}'), soft_wrap=True)
    if summary.get("report_uri"):
        console.print(Text(f"HTML report: {summary['report_uri']}"), soft_wrap=True)


def _announce_boot(info: Any) -> None:
    err.print(
        f"starting the local Prefect server (first run only, takes a few seconds): UI {info.ui_url}\n"
        "  it keeps running for the next runs; `recall-bench server stop` stops it, "
        "PREFECT_API_URL points runs at another server"
    )


def _check_reachable(url: str) -> None:
    """A configured ``PREFECT_API_URL`` that answers nothing fails in one line, before the run writes anything."""
    from recall_tasks.cli import server

    reason = server.unreachable(url)
    if reason:
        raise server.ServerError(
            f"the Prefect API at {url} (PREFECT_API_URL) cannot be reached ({reason}); start that server, "
            "or unset PREFECT_API_URL to use recall-bench's local server"
        )


@contextlib.contextmanager
def _prefect_api() -> Iterator[None]:
    """Point this process at ``PREFECT_API_URL`` if configured, else at the local server (started if needed).

    Never Prefect's temporary in-process server (see ``recall_tasks/server.py``). A configured URL that refuses
    connections fails here in one line, not after the Prefect client's retries. The local server's URL is set
    for the length of the run both in the environment (read by any ``Settings()`` built later) and as Prefect's
    current settings (the ones built when ``prefect`` was imported lack it); both are restored afterwards.
    """
    from recall_tasks.cli import server

    url, local = server.api_url_for_run(on_boot=_announce_boot)
    if not local:
        _check_reachable(url)
        yield
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    err.print(f"[dim]Prefect: local server, UI {url.removesuffix('/api')}[/]", highlight=False)
    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield
    finally:
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous


class _Terminated(BaseException):
    """SIGTERM outside Prefect's own handler, raised in the main thread as KeyboardInterrupt is for SIGINT."""


#: A repeated signal while an interrupted run cleans up is ignored, unless the clean-up takes longer than this.
FORCE_EXIT_AFTER_S = 10.0


@contextlib.contextmanager
def _interrupts() -> Iterator[dict[str, Any]]:
    """SIGINT and SIGTERM for the length of a run: the first one raises in the main thread, repeats are ignored.

    The first SIGINT raises KeyboardInterrupt, the first SIGTERM :class:`_Terminated` (while the flow runs,
    Prefect's engine holds SIGTERM and raises its TerminationSignal, then re-sends the signal to this handler).
    The flow's chunk loop turns either into an abort (judge calls cancelled, row cache flushed); a second
    Ctrl-C during that clean-up would interrupt it half-way (what logged "client has been closed" errors), so
    it is ignored unless the clean-up hangs past ``FORCE_EXIT_AFTER_S``.
    """
    state: dict[str, Any] = {"signal": None, "at": 0.0}

    def handler(signum: int, frame: Any) -> None:
        if state["signal"] is not None:
            if time.monotonic() - state["at"] > FORCE_EXIT_AFTER_S:
                err.print("interrupted again: exiting without finishing the clean-up")
                os._exit(128 + int(state["signal"]))
            return
        state["signal"], state["at"] = signum, time.monotonic()
        from recall_tasks._sync import cancel_all_scopes

        cancel_all_scopes()  # judge calls stop now, not when the exception reaches the flow's chunk loop
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise _Terminated

    if threading.current_thread() is not threading.main_thread():  # signals can only be handled there
        yield state
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield state
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


#: Notes the CLI printed before the flow; the flow logs them again for deployment runs: not twice on the console.
_printed_notes: set[str] = set()


def _own_warnings_only(record: logging.LogRecord) -> bool:
    if not record.name.startswith("recall_tasks") or record.levelno < logging.WARNING:
        return False
    return record.getMessage() not in _printed_notes


@contextlib.contextmanager
def _quiet_prefect_console(debug: bool) -> Iterator[None]:
    """Console logging shows only recall-bench's own warnings for the run (``--debug``: everything).

    Flow-run and task-run logs still go to the Prefect API (the UI shows them); the CLI prints its own summary,
    progress and one-line errors. Without this, a run printed Prefect's state lines and, on any failure, its
    tracebacks. Only console (stream) handlers are filtered, and only while the run lasts.
    """
    handlers: list[logging.Handler] = []
    if not debug:
        for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
            for handler in getattr(logger, "handlers", []):
                if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                    if _own_warnings_only not in handler.filters:
                        handler.addFilter(_own_warnings_only)
                        handlers.append(handler)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(_own_warnings_only)


def _run(params: RunParams, debug: bool = False, preflight: bool = False) -> dict[str, Any]:
    """Run the flow with a progress bar; an interrupt exits 130 (SIGTERM 143) after the abort's clean-up.

    ``preflight``: the run's checks first (before Prefect starts), inside the same interrupt handling.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from recall_tasks.pipeline import steps

    cached: list[int] = []
    with _interrupts() as state, contextlib.ExitStack() as stack:
        try:
            steps.add_abort_listener(cached.append)
            stack.callback(steps.remove_abort_listener, cached.append)
            if preflight:
                for note in _preflight(params):
                    _printed_notes.add(note)
                    err.print(f"[yellow]note:[/] {escape(redact(note))}")
                if os.environ.get("PREFECT_API_URL"):  # (a URL from a Prefect profile is checked after import)
                    _check_reachable(os.environ["PREFECT_API_URL"])
                steps.plan_ahead(params)  # the first chunk's judge calls overlap Prefect's start-up
                stack.callback(steps.abandon, params)  # a no-op once the flow took the plan
            stack.enter_context(_prefect_api())
            from recall_tasks.pipeline.flow import recall_benchmark

            stack.enter_context(_quiet_prefect_console(debug))
            progress = stack.enter_context(
                Progress(
                    TextColumn("scoring"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    console=err,
                    transient=True,
                    disable=not err.is_terminal,
                )
            )
            bar = progress.add_task("rows", total=None)

            def listener(done: int, total: int) -> None:
                progress.update(bar, completed=done, total=total)

            steps.add_progress_listener(listener)
            stack.callback(steps.remove_progress_listener, listener)
            return recall_benchmark(params)
        except BaseException as exc:
            if not _is_interrupt(exc) and state["signal"] is None:
                raise
            sig = state["signal"] or getattr(exc, "signal", None) or signal.SIGINT
            steps.abandon(params)  # interrupted before the flow took the plan: its rows count below
            err.print(
                f"interrupted: rerun the same command to resume ({sum(cached)} rows judged so far are cached)",
                highlight=False,
            )
            raise typer.Exit(code=128 + int(sig)) from None


def _is_interrupt(exc: BaseException) -> bool:
    """KeyboardInterrupt, our SIGTERM, Prefect's TerminationSignal, or a chunk's RunInterrupted."""
    from recall_tasks.errors import RunInterrupted

    if isinstance(exc, KeyboardInterrupt | _Terminated | RunInterrupted):
        return True
    return type(exc).__name__ == "TerminationSignal"


RUN_FIELDS = RunParams.model_fields


def _field(name: str) -> Any:
    """The default of a ``RunParams`` field: every default of ``run`` lives in the model, once."""
    return RUN_FIELDS[name].default


def _opt(name: str, *decls: str, **kw: Any) -> Any:
    """A ``run`` option for a ``RunParams`` field: its help text is the field's description."""
    return typer.Option(*decls, help=RUN_FIELDS[name].description, **kw)


#: ``run`` options that are not a field of the same name and type (``tests/test_cli_params.py`` checks the rest).
RUN_OPTION_FIELDS = {
    "output": "output_uri", "strict": "strict_mode", "reason": "include_reason", "column": "columns",
    "storage_option": "storage_options", "rpm": "requests_per_minute", "tpm": "tokens_per_minute",
    "dataset_uri": "dataset_uri",
    "wait": "batch_wait", "poll_interval": "poll_interval_s", "batch_timeout": "batch_timeout_s",
}  # fmt: skip


@app.command()
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
    chunk_size: Annotated[int, _opt("chunk_size")] = _field("chunk_size"),
    max_workers: Annotated[int, _opt("max_workers")] = _field("max_workers"),
    timeout_s: Annotated[float, _opt("timeout_s", "--timeout-s")] = _field("timeout_s"),
    max_retries: Annotated[int, _opt("max_retries")] = _field("max_retries"),
    label: Annotated[str | None, _opt("label")] = _field("label"),
    dataset_name: Annotated[str | None, _opt("dataset_name")] = _field("dataset_name"),
    segment_by: Annotated[list[str] | None, _opt("segment_by", "--segment-by")] = None,
    column: Annotated[list[str] | None, typer.Option("--column", help="role=name column mapping (repeatable)")] = None,
    format: FormatOption = None,
    storage_option: StorageOption = None,
    cache: Annotated[bool, _opt("cache", "--cache/--no-cache")] = _field("cache"),
    refresh_cache: Annotated[bool, _opt("refresh_cache", "--refresh-cache")] = _field("refresh_cache"),
    cache_uri: Annotated[str | None, _opt("cache_uri")] = _field("cache_uri"),
    chunk_cache_storage: Annotated[str | None, _opt("chunk_cache_storage")] = _field("chunk_cache_storage"),
    chunk_cache_days: Annotated[float, _opt("chunk_cache_days")] = _field("chunk_cache_days"),
    max_cost_usd: Annotated[float | None, _opt("max_cost_usd")] = _field("max_cost_usd"),
    max_requests: Annotated[int | None, _opt("max_requests")] = _field("max_requests"),
    max_error_rate: Annotated[float, _opt("max_error_rate")] = _field("max_error_rate"),
    index_version: Annotated[str | None, _opt("index_version")] = _field("index_version"),
    baseline: Annotated[str, typer.Option(help="latest | RUN_ID | label:LABEL | none (no comparison)")] = _field(
        "baseline"
    ),
    tolerance: Annotated[float, _opt("tolerance")] = _field("tolerance"),
    fail_on_regression: Annotated[bool, _opt("fail_on_regression", "--fail-on-regression")] = _field(
        "fail_on_regression"
    ),
    retriever: Annotated[str | None, _opt("retriever")] = _field("retriever"),
    retrieval_uri: Annotated[str | None, _opt("retrieval_uri")] = _field("retrieval_uri"),
    units: Annotated[str, _opt("units")] = _field("units"),
    extractor_model: Annotated[str | None, _opt("extractor_model")] = _field("extractor_model"),
    context_from: Annotated[str | None, _opt("context_from")] = _field("context_from"),
    context_extractor: Annotated[str | None, _opt("context_extractor")] = _field("context_extractor"),
    batch: Annotated[bool, _opt("batch", "--batch")] = _field("batch"),
    wait: Annotated[bool, _opt("batch_wait", "--wait")] = _field("batch_wait"),
    poll_interval: Annotated[float, _opt("poll_interval_s", "--poll-interval")] = _field("poll_interval_s"),
    batch_timeout: Annotated[float | None, _opt("batch_timeout_s", "--batch-timeout")] = _field("batch_timeout_s"),
    batch_fallback: Annotated[str, _opt("batch_fallback")] = _field("batch_fallback"),
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
) -> None:
    """Score a dataset and commit results and run aggregates."""
    from recall_tasks.io.datasets import parse_column_overrides

    try:
        params = RunParams.model_validate(
            {
                "dataset_uri": dataset_uri, "output_uri": output, "metric": metric, "judge": judge, "model": model,
                "base_url": base_url, "threshold": threshold, "scale": scale, "strict_mode": strict,
                "include_reason": reason, "on_missing": on_missing, "max_concurrency": max_concurrency,
                "requests_per_minute": rpm, "tokens_per_minute": tpm, "chunk_size": chunk_size,
                "max_workers": max_workers, "timeout_s": timeout_s, "max_retries": max_retries, "label": label,
                "dataset_name": dataset_name, "segment_by": segment_by or [],
                "columns": parse_column_overrides(column or []),
                "format": format or _detect_format(output, storage_option),
                "storage_options": _split_storage_options(storage_option or []), "cache": cache,
                "refresh_cache": refresh_cache, "cache_uri": cache_uri, "chunk_cache_storage": chunk_cache_storage,
                "chunk_cache_days": chunk_cache_days, "max_cost_usd": max_cost_usd, "max_requests": max_requests,
                "max_error_rate": max_error_rate, "index_version": index_version,
                "baseline": None if baseline.lower() == "none" else baseline, "tolerance": tolerance,
                "fail_on_regression": fail_on_regression, "retriever": retriever, "retrieval_uri": retrieval_uri,
                "units": units, "extractor_model": extractor_model, "context_from": context_from,
                "context_extractor": context_extractor,
                "batch": batch, "batch_wait": wait, "poll_interval_s": poll_interval, "batch_timeout_s": batch_timeout,
                "batch_fallback": batch_fallback,
            }
        )  # fmt: skip
        err.print(_judge_line(params), markup=False, highlight=False)
        summary = _run(params, debug, preflight=True)
    except RegressionDetected as exc:
        _print_outcome(exc.summary, output)
        err.print(f"[bold red]regression:[/] {escape(redact(str(exc)))}")
        raise typer.Exit(code=3) from None
    except RunFailed as exc:
        _print_outcome(exc.summary, output)
        err.print(f"[bold red]run failed:[/] {escape(redact(str(exc)))}")
        raise typer.Exit(code=4) from None
    except ValidationError as exc:
        _fail(ValueError(_validation_message(exc)), debug)
    except RecallBenchError as exc:
        _fail(exc, debug)
    except (typer.Exit, typer.Abort):
        raise
    except Exception as exc:  # noqa: BLE001 - anything else is still one line (--debug: the traceback)
        _fail_unexpected(exc, debug)
    if summary.get("status") == "batch_pending":  # submitted or still running: nothing committed yet
        from recall_tasks.cli.batch import print_pending

        return print_pending(summary, console)
    _print_outcome(summary, output)


def _preflight(params: RunParams) -> list[str]:
    """The run's checks before Prefect starts (the flow repeats them for deployments); returns notes."""
    from recall_tasks.pipeline import steps

    return steps.preflight(params)


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
        reason = escape(redact(str(summary["status_reason"])))
        err.print(f"[yellow]judging stopped early: {reason}; rows not judged are marked[/]")


@app.command()
def demo(
    output: OutputOption = DEFAULT_OUTPUT,
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
) -> None:
    """Score the bundled sample dataset with the offline judge, end to end through Prefect."""
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
    params = RunParams(
        dataset_uri=str(path),
        output_uri=output,
        judge="lexical",
        label="demo",
        on_missing="skip",
        segment_by=["category"],
        chunk_size=4,
    )
    err.print(_judge_line(params), markup=False, highlight=False)
    try:
        summary = _run(params, debug)
        _print_summary(summary, output)
        console.print("\nThe five least supported rows and their unsupported sentences:", soft_wrap=True)
        # ties broken by row_id: the demo prints the same table every time (the README test compares it)
        _print_query(_store(output, "delta", None), output, _DEMO_WORST_ROWS, limit=5, fmt="table")
    except RecallBenchError as exc:
        _fail(exc, debug)
    except (typer.Exit, typer.Abort):
        raise
    except Exception as exc:  # noqa: BLE001 - anything else is still one line (--debug: the traceback)
        _fail_unexpected(exc, debug)


_DEMO_WORST_ROWS = (
    "SELECT row_id, category, score, coalesce(nullif(array_to_string(list_transform("
    "list_filter(verdicts, lambda v: v.verdict <> 'yes'), lambda v: v.statement), ' / '), ''), reason) "
    "AS not_supported FROM results ORDER BY score NULLS FIRST, row_id LIMIT 5"
)


def _judge_line(params: RunParams) -> str:
    from recall_tasks.cli.output import judge_line

    return redact(judge_line(params.judge, params.model, params.base_url))


def _detect_format(output: str, storage_option: list[str] | None, storage: Any = None) -> str:
    """``--format`` when not given: what the tables already at ``output`` are (see results.detect_format)."""
    from recall_tasks.io.results import detect_format
    from recall_tasks.io.storage import StorageConfig

    if storage is None:
        storage = StorageConfig.from_options(_split_storage_options(storage_option or []))
    return detect_format(output, storage)


def _store(output: str, format: str | None, storage_option: list[str] | None) -> Any:
    """The result store at ``output``; ``format`` None: detected from the tables already there."""
    from recall_tasks.io.results import ResultStore
    from recall_tasks.io.storage import StorageConfig

    storage = StorageConfig.from_options(_split_storage_options(storage_option or []))
    if format is None:
        format = _detect_format(output, storage_option, storage)
    elif format not in ("delta", "parquet"):
        raise ConfigError(f"--format must be delta or parquet, got {format!r}")
    return ResultStore(output, storage, format)  # type: ignore[arg-type]


def _print_query(store: Any, output: str, sql: str, limit: int, fmt: OutputFormat) -> None:
    """Run ``sql`` on the read-only connection (see recall_tasks.io.sql) and print at most ``limit`` rows."""
    import duckdb

    from recall_tasks.cli.output import cut_notice, print_rows
    from recall_tasks.io.sql import TABLES, connect_readonly, explain_error

    tables = {name: ds for name in TABLES if (ds := store.read_table(name)) is not None}
    con = connect_readonly(tables)
    total: int | None = None
    try:
        rel = con.sql(sql)
        if rel is None:
            return
        rows: Iterable[Any]
        if limit <= 0:
            rows = rel.iter_rows(batch_size=4096)  # streamed: `--limit 0` exports of 1M rows hold one batch
        else:
            head = rel.limit(limit + 1).fetchall()
            if len(head) > limit:
                head, total = head[:limit], rel.aggregate("count(*)").fetchall()[0][0]
            rows = head
        shown = print_rows(rel.columns, rows, fmt, console)
    except duckdb.Error as exc:
        raise explain_error(exc, set(tables), output) from None
    finally:
        con.close()
    _print_notice(cut_notice(shown, total if total is not None else shown))


LimitOption = Annotated[int, typer.Option(help="Print at most this many rows; 0 for all")]


@app.command()
def query(
    sql: Annotated[str, typer.Argument(help="SQL over the tables `results`, `runs` and `comparisons`")],
    output: OutputOption = DEFAULT_OUTPUT,
    format: FormatOption = None,
    storage_option: StorageOption = None,
    limit: LimitOption = 50,
    output_format: OutputFormatOption = "table",
) -> None:
    """Run read-only DuckDB SQL over the result tables and print the answer (files and settings are locked)."""
    fmt = _output_format(output_format)
    try:
        _print_query(_store(output, format, storage_option), output, sql, limit, fmt)
    except RecallBenchError as exc:
        _fail(exc)


@app.command()
def history(
    output: OutputOption = DEFAULT_OUTPUT,
    dataset: Annotated[str | None, typer.Option(help="Only this dataset")] = None,
    format: FormatOption = None,
    storage_option: StorageOption = None,
    limit: Annotated[int, typer.Option(help="Print the latest runs only, at most this many; 0 for all")] = 30,
    output_format: OutputFormatOption = "table",
) -> None:
    """The series of runs: mean with its 95 % CI, pass rate, judge, and the verdict against each run's baseline.

    csv and json print the raw fields (ISO timestamps, unrounded numbers, verdict and baseline run id apart).
    """
    import pyarrow.compute as pc

    from recall_tasks.cli.output import (
        HISTORY_COLUMNS,
        HISTORY_FIELDS,
        cut_notice,
        history_cells,
        history_records,
        print_rows,
    )

    fmt = _output_format(output_format)
    try:
        store = _store(output, format, storage_option)
        runs_ds = store.read_table("runs")
        comparisons_ds = store.read_table("comparisons")
        if runs_ds is None:
            raise ConfigError(f"no runs recorded under {output}")
        runs = runs_ds.to_table()
        if dataset:
            runs = runs.filter(pc.equal(runs.column("dataset"), dataset))
            if runs.num_rows == 0:
                raise ConfigError(f"no runs of dataset {dataset!r} recorded under {output}")
        comparisons = comparisons_ds.to_table() if comparisons_ds is not None else None
    except RecallBenchError as exc:
        _fail(exc)
    records = history_records(runs, comparisons)
    shown = records[-limit:] if limit > 0 else records
    if fmt in ("csv", "json"):
        print_rows(HISTORY_FIELDS, ([r[f] for f in HISTORY_FIELDS] for r in shown), fmt, console)
    else:
        print_rows(HISTORY_COLUMNS, (history_cells(r) for r in shown), fmt, console, keep_whole=["run_id"])
    _print_notice(cut_notice(len(shown), len(records)))


@app.command()
def report(
    run_id: Annotated[str, typer.Argument(help="The run to report on")],
    output: OutputOption = DEFAULT_OUTPUT,
    format: FormatOption = None,
    storage_option: StorageOption = None,
    to: Annotated[
        Path | None, typer.Option("--to", help="Write the HTML to this local file (or folder) instead of --output")
    ] = None,
) -> None:
    """Write a self-contained HTML report of a run (next to the tables, or --to a local path); print where."""
    from recall_tasks.reports.html import render_run_report, write_report

    try:
        store = _store(output, format, storage_option)
        if to is None:
            where = write_report(store, run_id)
        else:
            document = render_run_report(store, run_id)
            target = to / f"{run_id}.html" if to.is_dir() else to
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(document, encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"--to {to}: cannot write the report: {exc.strerror or exc}") from None
            where = str(target)
    except RecallBenchError as exc:
        _fail(exc)
    console.print(Text(where), soft_wrap=True)


server_app = typer.Typer(
    no_args_is_help=True,
    help="The local Prefect server that run and demo use when PREFECT_API_URL is not set.",
)
app.add_typer(server_app, name="server")
app.add_typer(batch_app, name="batch")


def _server_line(info: Any) -> str:
    from recall_tasks.cli import server

    return f"UI {info.ui_url}, API {info.api_url} (pid {info.pid}, state {server.state_dir()})"


@server_app.command("start")
def server_start(
    port: Annotated[
        int | None, typer.Option(help="Port on 127.0.0.1 (default $RECALL_BENCH_SERVER_PORT or 4250)")
    ] = None,
) -> None:
    """Start the local Prefect server in the background (or report the one running)."""
    from recall_tasks.cli import server

    try:
        info, started = server.start(port, on_boot=lambda i: err.print("starting the local Prefect server..."))
    except RecallBenchError as exc:
        _fail(exc)
    console.print(
        f"local Prefect server {'started' if started else 'already running'}: {_server_line(info)}", soft_wrap=True
    )


@server_app.command("status")
def server_status() -> None:
    """Whether the local Prefect server runs (exit 0) or not (exit 1), and its addresses."""
    from recall_tasks.cli import server

    current = server.status()
    if os.environ.get("PREFECT_API_URL"):
        err.print(f"note: PREFECT_API_URL is set ({os.environ['PREFECT_API_URL']}): runs use that server, not this one")
    if current.info is None:
        stale = " (removed the record of a server that is gone)" if current.stale_removed else ""
        console.print(f"local Prefect server: stopped{stale}", soft_wrap=True)
        raise typer.Exit(code=1)
    console.print(f"local Prefect server: {current.state}, {_server_line(current.info)}", soft_wrap=True)


@server_app.command("stop")
def server_stop() -> None:
    """Stop the local Prefect server (its database is kept for the next start)."""
    from recall_tasks.cli import server

    info = server.stop()
    console.print(
        "local Prefect server: not running" if info is None else f"stopped the local Prefect server (pid {info.pid})"
    )


events.register(app)
