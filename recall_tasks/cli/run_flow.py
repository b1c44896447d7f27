"""How ``run``, ``demo`` and ``batch collect`` run the benchmark flow: progress bar, interrupts, exit codes.

:func:`execute` runs the flow for validated parameters and prints its outcome with the exit codes of ``run``
(``EXIT_CODES`` in :mod:`recall_tasks.cli.app`); :func:`one_line_errors` turns every error into one ``error:``
line. The process around a run (Prefect API, signals, quiet console logging) is :mod:`recall_tasks.cli.runtime`.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import typer
from pydantic import ValidationError

from recall_tasks.cli.common import _fail, _fail_unexpected, err, plain
from recall_tasks.cli.losses import print_run_losses
from recall_tasks.cli.outcome import judge_line_of, print_outcome, print_pending
from recall_tasks.cli.runtime import _interrupts, _is_interrupt, _prefect_api, _quiet_prefect_console, signals_default
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
    from recall_tasks.pipeline.run import NoObserver


def _row_progress() -> RowProgress:
    from recall_tasks.pipeline.progress import RowProgress

    return RowProgress()


class _Watch:
    """The CLI's :class:`~recall_tasks.pipeline.run.RunObserver`: the rows settled so far (``shown``), the progress
    bar, and the rows an abort left cached (the interrupt message says how many). Not a dataclass: pydantic would
    dump one field by field into the flow run's context for worker processes, bar and locks included."""

    def __init__(self) -> None:
        self.cached: list[int] = []
        self.shown: RowProgress = _row_progress()
        self.bar: Callable[[], None] | None = None

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

    def note(self, message: str) -> None:
        err.print(f"[yellow]note:[/] {plain(message)}")

    def __reduce__(self) -> tuple[type[NoObserver], tuple[()]]:
        """Nobody watches in another process: Prefect pickles the flow run's parameters (this observer among them)
        into the context of every task run it sends to a worker process; the bar is this process's."""
        from recall_tasks.pipeline.run import NoObserver

        return (NoObserver, ())


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


def _run(params: RunParams, debug: bool = False) -> FlowSummary:
    """Run the flow with a progress bar; an interrupt exits 130 (SIGTERM 143) after the abort's clean-up.

    Prefect is imported first, with Ctrl-C ending the process as any program's (nothing is judged or written yet,
    and an interrupt raised inside Prefect's import was caught there, printed as a traceback and lost); the run's
    own interrupt handling starts with the flow.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from recall_tasks._sync import CancelScope

    _refuse_early(params)
    with signals_default():
        from recall_tasks.pipeline.flow import watched_benchmark
    watch = _Watch()
    scope = CancelScope()  # this run's judge calls: the interrupt handler cancels them at once
    with _interrupts(scope) as state, contextlib.ExitStack() as stack:
        try:
            stack.enter_context(_prefect_api())
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
            rows = watch.shown  # settled chunks plus the rows settled in those in flight (pipeline/progress.py)
            bar = progress.add_task("rows", total=rows.total, completed=rows.shown)

            def draw() -> None:
                progress.update(bar, completed=rows.shown, total=rows.total)

            watch.bar = draw
            return watched_benchmark(params, watch, scope)
        except BaseException as exc:
            if not _is_interrupt(exc) and state["signal"] is None:
                raise
            sig = state["signal"] or getattr(exc, "signal", None) or signal.SIGINT
            err.print(
                f"interrupted: rerun the same command to resume ({sum(watch.cached)} rows judged so far are cached)",
                highlight=False,
            )
            raise typer.Exit(code=128 + int(sig)) from None


def _refuse_early(params: RunParams) -> None:
    """The dry run's checks (``check_run(contact=False)``: no endpoint contacted, nothing written) before Prefect
    is started: a run its inputs refuse is refused in one line without booting the local server. The flow checks
    again, with the endpoint's probes, when it plans; nothing of this pass is kept."""
    from recall_tasks.pipeline.components import release_judge
    from recall_tasks.pipeline.steps import check_run

    release_judge(check_run(params, contact=False).metric.judge)


def _print_wait(message: str) -> None:
    err.print(f"waiting: {plain(message)}", highlight=False, soft_wrap=True)


def execute(params: RunParams, output: str, debug: bool = False, batch_key: str | None = None) -> None:
    """Run the flow for ``params`` and print its outcome with the exit codes of ``run`` (``batch collect`` too:
    ``batch_key``, the run key its record was written under, must be the run's, or the data changed)."""
    with one_line_errors(debug):
        try:
            err.print(judge_line_of(params), markup=False, highlight=False)
            summary = _run(params, debug)
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
