"""Errors raised by recall-bench.

The tree, and what the pipeline does with each branch::

    RecallBenchError                  base of everything raised on purpose
    ├── ConfigError                   the run's configuration is wrong: stop before anything is written
    │   ├── DatasetError              a dataset cannot be read or has the wrong schema (names file, column)
    │   ├── RunInProgress             another attempt of the same run holds a live lease (io/lease.py)
    │   ├── QueryRefused              ``query`` SQL asking for files, COPY, settings, extensions (io/sql.py)
    │   └── ServerError               the local Prefect server cannot be started or reached (cli/server.py)
    ├── MissingInputError             a row lacks a required field (on_missing="error"): the row is recorded
    │                                 with this error, the run goes on
    ├── JudgeError                    a judge could not produce verdicts
    │   ├── JudgeConfigError          auth (401/403), quota, unknown model (404): not retried, stops the run
    │   ├── JudgeRejectedError        the endpoint rejected one request (400 context_length_exceeded, a proxy's
    │   │   │                         413...): that row's error; rejected requests in a row, none accepted, trip
    │   │   │                         the run's circuit breaker (a bad model name or parameter: the run fails)
    │   │   └── ContextOverflowError  the prompt would not fit the model's context window: not sent (row error)
    │   ├── JudgeTransientError       429/5xx/timeouts still failing after the retry budget: row error
    │   └── JudgeResponseError        the judge's answer could not be parsed, even after one repair: row error
    ├── StorageError                  object store unreachable, missing object, wrong credentials
    │   └── StoreUnreachable          object storage failed while the run was judging: nothing committed, the
    │                                 judged rows kept (row cache, or its local spill): the same command resumes
    ├── RegressionDetected            --fail-on-regression and the baseline comparison says regressed
    │                                 (raised after everything is written)
    ├── RunFailed                     the run was recorded with status failed (too many row errors, or an
    │                                 outage stopped judging): raised after everything is written
    ├── BudgetExhausted               the run was recorded with status budget_exhausted (--max-requests /
    │                                 --max-cost-usd stopped judging): raised after everything is written
    ├── IncomparableBaseline          --fail-on-regression and the comparison says incomparable (judge drift or
    │                                 a changed configuration), without --allow-incomparable
    ├── RunInterrupted                the run was cancelled (SIGINT/SIGTERM): judge calls in flight cancelled,
    │                                 nothing committed, judged rows kept in the row cache
    ├── WorkerDied                    a worker process of --task-runner processes died (SIGKILL, out of memory):
    │   │                             the pool is gone, nothing committed, finished chunks cached for the rerun
    │   └── LeaseLost                 this attempt's lease was not renewed in time and another attempt of the
    │                                 same run took it over: nothing committed by this attempt (io/lease.py)
    ├── MaintenanceConflict           ``maintain`` lost every retry of a commit to runs committing (exit 4;
    │                                 io/maintenance.py)
    ├── UnsafeOrphanRemoval           ``maintain`` refused an orphan clean-up that would not have recognised
    │                                 the table's own files: nothing deleted (io/maintenance.py)
    └── RecordChanged                 a --batch record was written by another process since it was read: the
        │                             caller re-reads it (pipeline/batch/record.py)
        └── Busy                      another process is creating one of the record's batches right now
                                      (pipeline/batch/remote.py)

The classes whose module is named are defined in that module, where they are raised.

Exit codes of ``recall-bench run`` and ``recall-bench batch collect`` (and the flow run's state):

    0    the run completed (whatever its verdict, unless --fail-on-regression); a --batch run pending, or with
         --collect-only nothing to collect
    2    usage, configuration or dataset error: nothing was judged or written, no run recorded; or another
         attempt of the same run is judging (RunInProgress, io/lease.py)
    3    the run regressed against its baseline and --fail-on-regression is set (flow run Failed)
    4    the run failed: its rows are committed with status failed (flow run Failed); or a worker process
         died (WorkerDied) or object storage failed mid-run (StoreUnreachable): nothing committed, the rerun
         resumes
    5    a budget stopped judging: rows committed with status budget_exhausted (flow run Failed)
    6    incomparable to its baseline with --fail-on-regression, unless --allow-incomparable (flow run Failed)
    7    no baseline to compare with and --require-baseline is set (BaselineMissing; flow run Failed)
    130  interrupted (SIGINT; 143 for SIGTERM): nothing committed, judged rows cached for the rerun

When several apply to one run, the first of 4, 5, 3, 6, 7 is the code (``publish.raise_for_outcome``).

Every message says what to fix. No message ever contains an API key or a storage secret
(see ``recall_tasks.secrets.redact``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from recall_tasks.summaries import RunSummary


class RecallBenchError(Exception):
    """Base class of every error recall-bench raises on purpose."""


class ConfigError(RecallBenchError):
    """The configuration of a run is invalid; nothing has been written."""


class DatasetError(ConfigError):
    """A dataset cannot be read or does not have the expected schema."""

    def __init__(
        self, message: str, *, uri: str | None = None, column: str | None = None, row: int | None = None
    ) -> None:
        parts = [message]
        where = []
        if uri:
            where.append(f"file {uri}")
        if row is not None:
            where.append(f"row {row}")
        if column:
            where.append(f"column {column!r}")
        if where:
            parts.append(f"({', '.join(where)})")
        super().__init__(" ".join(parts))
        self.uri = uri
        self.column = column
        self.row = row


class MissingInputError(RecallBenchError):
    """A required field of a case is missing or empty and the policy is ``on_missing="error"``."""

    def __init__(self, field: str, metric: str, *, flags: bool = False) -> None:
        skip, zero = ("--on-missing skip", "--on-missing zero") if flags else ("on_missing='skip'", "on_missing='zero'")
        super().__init__(
            f"{metric}: required field {field!r} is missing or empty; provide it, or set "
            f"{skip} (not assessed) or {zero} (score 0)"
        )
        self.field = field
        self.metric = metric

    def with_flags(self) -> str:
        """The message naming the CLI's flags, as the pipeline (run by the CLI or a deployment) records it."""
        return str(MissingInputError(self.field, self.metric, flags=True))


class JudgeError(RecallBenchError):
    """A judge could not produce verdicts for a case."""

    def __init__(self, message: str, *, model: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.model = model
        self.status = status
        self.requests = 0  # HTTP attempts the failed call made (retries included), set by the judge


class JudgeConfigError(JudgeError):
    """The judge endpoint rejected the request for a reason retrying cannot fix (auth, quota, 400)."""


class JudgeRejectedError(JudgeError):
    """The endpoint rejected one request (a 4xx other than 401/403/404/429: a context too long, a body too large
    for a proxy, a value it refuses): the row's error. Rejections of every request stop the run through the run's
    circuit breaker (:meth:`~recall_tasks.fleet.guards.CircuitBreaker.request_rejected`)."""


class ContextOverflowError(JudgeRejectedError):
    """The row's prompt and reply budget would exceed the model's context window (``--on-overlong refuse``, or a
    prompt that does not fit even with its context cut): nothing was sent."""


class JudgeTransientError(JudgeError):
    """Transient failures (429, 5xx, timeouts, resets) outlasted the retry budget."""


class JudgeResponseError(JudgeError):
    """The judge answered, but its answer could not be parsed into verdicts, even after a repair request."""


class StorageError(RecallBenchError):
    """Object storage could not be read or written (missing object, credentials, endpoint)."""


class StoreUnreachable(StorageError):
    """Object storage failed while the run was judging (after its checks passed): nothing could be committed, the
    rows judged were kept in the row cache or, when that could not be saved either, its local spill
    (``io/cache.py``); the same command resumes once the store is back. A failed run: exit 4, not 2."""


class RegressionDetected(RecallBenchError):
    """The run regressed against its baseline and ``fail_on_regression`` is set; results are committed."""

    def __init__(self, message: str, summary: RunSummary | None = None) -> None:
        super().__init__(message)
        self.summary: RunSummary = summary if summary is not None else cast("RunSummary", {})  # {}: unpickled


class RunFailed(RecallBenchError):
    """The run was committed with status ``failed``; ``summary`` is its run summary (what the CLI prints)."""

    def __init__(self, message: str, summary: RunSummary | None = None) -> None:
        super().__init__(message)
        self.summary: RunSummary = summary if summary is not None else cast("RunSummary", {})  # {}: unpickled


class BudgetExhausted(RecallBenchError):
    """The run was committed with status ``budget_exhausted``: a partial run, never read as a completed one."""

    def __init__(self, message: str, summary: RunSummary | None = None) -> None:
        super().__init__(message)
        self.summary: RunSummary = summary if summary is not None else cast("RunSummary", {})  # {}: unpickled


class IncomparableBaseline(RecallBenchError):
    """``fail_on_regression`` is set and the comparison is ``incomparable`` (``allow_incomparable`` not set)."""

    def __init__(self, message: str, summary: RunSummary | None = None) -> None:
        super().__init__(message)
        self.summary: RunSummary = summary if summary is not None else cast("RunSummary", {})  # {}: unpickled


class BaselineMissing(RegressionDetected):
    """``require_baseline`` is set and the completed run had no baseline to compare with (exit 7); results are
    committed. A :class:`RegressionDetected` for the callers that gate on it (``evaluate()``, a Prefect flow run
    ends Failed); the CLI tells the two apart by the summary's ``baseline_missing`` (``cli.outcome.print_outcome``)."""


class RunInterrupted(RecallBenchError):
    """The run's judging was cancelled (an interrupt): nothing is committed, judged rows stay in the row cache."""


class WorkerDied(RecallBenchError):
    """A worker process of the run's process pool died mid-run: the pool is broken, nothing is committed.

    The chunks that finished before are in Prefect's chunk cache and their rows in the row cache: the same
    command resumes the run (its ``_pending`` marker stays).
    """


def one_line(exc: BaseException, limit: int = 300, *, empty: str | None = None) -> str:
    """An exception's message on one line (pyarrow's and the SDKs' span several), clipped to ``limit``
    characters; an empty message gives ``empty``, by default the exception's type name."""
    text = " ".join(str(exc).split())[:limit]
    return text or (type(exc).__name__ if empty is None else empty)
