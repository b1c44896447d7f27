"""How ``run``, ``demo`` and ``batch collect`` run the benchmark flow: pre-flight, progress bar, exit codes.

:func:`execute` runs the flow for validated parameters and prints its outcome with the exit codes of ``run``
(``EXIT_CODES`` in :mod:`recall_tasks.cli.app`); :func:`one_line_errors` turns every error into one ``error:``
line. The process around a run (Prefect API, signals, quiet console logging) is :mod:`recall_tasks.cli.runtime`.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import typer
from pydantic import ValidationError

from recall_tasks.cli.common import _fail, _fail_unexpected, err, plain
from recall_tasks.cli.losses import print_run_losses
from recall_tasks.cli.outcome import judge_line_of, print_outcome, print_pending
from recall_tasks.cli.runtime import (
    _check_reachable,
    _interrupts,
    _is_interrupt,
    _prefect_api,
    _quiet_prefect_console,
    freeze_heap,
    gc_paused,
    interrupts_deferred,
)
from recall_tasks.config import RunParams
from recall_tasks.errors import (
    BudgetExhausted,
    ConfigError,
    IncomparableBaseline,
    RecallBenchError,
    RegressionDetected,
    RunFailed,
    StoreUnreachable,
    WorkerDied,
)
from recall_tasks.summaries import FlowSummary

if TYPE_CHECKING:
    from recall_tasks.pipeline.progress import RowProgress
    from recall_tasks.pipeline.run import Prepared


@dataclass
class Session:
    """One ``recall-bench`` invocation (``app.console_main`` opens it around the Typer app): what the command
    leaves for the process around it."""

    #: the signal of an interrupt whose clean-up is done (``console_main`` then exits at once)
    interrupted: int | None = None


#: the invocation under way. Not click's context object: Typer 0.2x ships its own click, whose context the
#: ``click`` package cannot see, so an interrupted run never reached the fast exit (``session_scope``).
_sessions: list[Session] = []


@contextlib.contextmanager
def session_scope(session: Session) -> Iterator[Session]:
    """``session`` is the invocation :func:`mark_interrupted` reports to, for the length of the block."""
    _sessions.append(session)
    try:
        yield session
    finally:
        _sessions.remove(session)


def mark_interrupted(sig: int) -> None:
    """Tell ``console_main`` that this command's interrupt clean-up is done (no-op outside ``console_main``)."""
    for session in _sessions:
        session.interrupted = sig


def _row_progress() -> RowProgress:
    from recall_tasks.pipeline.progress import RowProgress

    return RowProgress()


@dataclass
class _Watch:
    """The CLI's :class:`~recall_tasks.pipeline.run.RunObserver`: the rows settled so far (``shown``, counted from
    the head start on, before the bar exists: the first chunk's rows used to be lost and the bar jumped by them),
    the progress bar once drawn, and the rows an abort left cached (the interrupt message sums them: the flow's
    abort and a head start no flow took)."""

    cached: list[int] = field(default_factory=list)
    shown: RowProgress = field(default_factory=_row_progress)
    bar: Callable[[], None] | None = None

    def progress(self, done: int, total: int) -> None:
        self.shown.chunks(done, total)
        if self.bar is not None:
            self.bar()

    def rows(self, seq: int, n: int | None) -> None:
        self.shown.rows(seq, n)
        if self.bar is not None:
            self.bar()

    def aborted(self, rows_cached: int) -> None:
        self.cached.append(rows_cached)

    def waiting(self, message: str) -> None:
        _print_wait(message)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(map(str, e["loc"]))
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


@contextlib.contextmanager
def one_line_errors(debug: bool) -> Iterator[None]:
    """Every error of ``run`` and ``batch collect`` as one ``error:`` line, exit 2 (``--debug``: the traceback);
    ``typer.Exit`` and ``Abort`` (the codes already decided) pass."""
    try:
        yield
    except ValidationError as exc:
        _fail(ValueError(_validation_message(exc)), debug)
    except RecallBenchError as exc:
        _fail(exc, debug)
    except (typer.Exit, typer.Abort):
        raise
    except Exception as exc:  # noqa: BLE001 - anything else is still one line (--debug: the traceback)
        _fail_unexpected(exc, debug)


def _run(params: RunParams, debug: bool = False, preflight: bool = False) -> FlowSummary:
    """Run the flow with a progress bar; an interrupt exits 130 (SIGTERM 143) after the abort's clean-up.

    ``preflight``: the run's checks first (before Prefect starts), inside the same interrupt handling.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from recall_tasks.pipeline import head_start

    watch = _Watch()
    prepared = None
    with _interrupts() as state, contextlib.ExitStack() as stack:
        stack.enter_context(gc_paused())  # until Prefect is imported (freeze_heap below)
        try:
            if preflight:
                prepared = _preflight(params)
                for note in prepared.notes:
                    err.print(f"[yellow]note:[/] {plain(note)}")
                # live: PREFECT_API_URL is Prefect's own setting (a URL from a Prefect profile is checked after import)
                if os.environ.get("PREFECT_API_URL"):
                    _check_reachable(os.environ["PREFECT_API_URL"])
                head_start.plan_ahead(prepared, watch)  # the first chunk's judge calls overlap Prefect's start-up
                stack.callback(head_start.abandon, prepared, watch)  # a no-op once the flow took the plan
            with interrupts_deferred(state):  # Prefect's import runs whole; an interrupt in it is raised after it
                from recall_tasks.pipeline.flow import handing_off, recall_benchmark
            stack.enter_context(_prefect_api())
            freeze_heap()  # what start-up imported: no collection walks it again
            stack.enter_context(_quiet_prefect_console(debug, prepared.notes if prepared else ()))
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
            rows = watch.shown  # settled chunks plus the rows settled in those in flight (pipeline/progress.py)
            if rows.total is None and prepared is not None and prepared.plan is not None:
                rows.total = prepared.plan.dataset.num_rows  # the head start judges before the chunk loop says it
            bar = progress.add_task("rows", total=rows.total, completed=rows.shown)

            def draw() -> None:
                progress.update(bar, completed=rows.shown, total=rows.total)

            watch.bar = draw
            with handing_off(prepared, watch):  # what this process prepared reaches the flow it calls
                return recall_benchmark(params)
        except BaseException as exc:
            if not _is_interrupt(exc) and state["signal"] is None:
                raise
            sig = state["signal"] or getattr(exc, "signal", None) or signal.SIGINT
            if prepared is not None:  # interrupted before the flow took the plan: its rows count below
                head_start.abandon(prepared, watch)
            err.print(
                f"interrupted: rerun the same command to resume ({sum(watch.cached)} rows judged so far are cached)",
                highlight=False,
            )
            mark_interrupted(int(sig))
            raise typer.Exit(code=128 + int(sig)) from None


def _print_wait(message: str) -> None:
    err.print(f"waiting: {plain(message)}", highlight=False, soft_wrap=True)


def execute(params: RunParams, output: str, debug: bool = False, batch_key: str | None = None) -> None:
    """Run the flow for ``params`` and print its outcome with the exit codes of ``run`` (``batch collect`` too:
    ``batch_key``, the run key its record was written under, must be the run's, or the data changed)."""
    with one_line_errors(debug):
        try:
            err.print(judge_line_of(params), markup=False, highlight=False)
            summary = _run(params, debug, preflight=True)
        except RegressionDetected as exc:
            print_outcome(exc.summary, output)
            print_run_losses(params, exc.summary, output)
            err.print(f"[bold red]regression:[/] {plain(exc)}")
            raise typer.Exit(code=3) from None
        except RunFailed as exc:
            print_outcome(exc.summary, output)
            err.print(f"[bold red]{plain(exc)}[/]")  # "run <id> failed: <why>"
            raise typer.Exit(code=4) from None
        except BudgetExhausted as exc:  # print_outcome says so in one line
            print_outcome(exc.summary, output)
            raise typer.Exit(code=5) from None
        except IncomparableBaseline as exc:
            print_outcome(exc.summary, output)
            err.print(f"[bold red]incomparable:[/] {plain(exc)}", soft_wrap=True)
            raise typer.Exit(code=6) from None
        except (WorkerDied, StoreUnreachable) as exc:  # a failed run with nothing committed: the same command resumes
            _fail(exc, debug, code=4)
    if summary["status"] == "batch_pending" or summary["status"] == "batch_idle":  # nothing committed (yet)
        if batch_key is not None and summary["run_key"] != batch_key:
            _fail(ConfigError(
                f"the data of {params.dataset_uri} changed since its batches were submitted (run key now "
                f"{summary['run_key']}, recorded {batch_key}): the batches cannot be matched to its rows; "
                f"`recall-bench batch cancel -o {output} {batch_key}` cancels them"
            ), debug)  # fmt: skip
        return print_pending(summary)
    print_outcome(summary, output)
    print_run_losses(params, summary, output)  # a regressed verdict: the segments and rows that lost most


def _preflight(params: RunParams) -> Prepared:
    """The run's checks before Prefect starts (the flow repeats them for deployments): their result and notes."""
    from recall_tasks.pipeline import head_start

    return head_start.preflight(params)
