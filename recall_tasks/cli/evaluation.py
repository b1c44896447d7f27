"""``recall_tasks.evaluate`` and ``a_evaluate``: a whole dataset scored from Python, as ``recall-bench run`` does.

The entry point ragas and deepeval users look for: data in (a Parquet/JSONL/CSV path, a pyarrow Table, a pandas
DataFrame or a list of dicts, with ``run``'s column names and ``--column`` mapping), per-row results out (a pyarrow
Table with the ``results`` schema, ``.to_pandas()``) with the run's row of ``runs``. Every ``run`` option is a
keyword (the :class:`~recall_tasks.config.RunParams` field names), checked by the same model.

Decisions:

- **Where it runs.** ``prefect=False`` (the default, for notebooks and scripts): the flow's steps in this process
  without Prefect (``pipeline/local_run.py``: no server to start, no flow run; the row cache, budgets, concurrency
  and tables are the run's). ``prefect=True``: the Prefect flow itself, exactly as ``run`` calls it, on
  ``PREFECT_API_URL`` or recall-bench's local server (started if needed; ``cli/server.py``), with its flow run,
  chunk cache, artifacts and events. That is why this module sits with the command line: it shares ``run``'s
  process-level pieces (the local server, the API setting).
- **Event loops.** Both functions run the work in a thread of its own and wait for it: nothing depends on whether
  the caller's thread runs an event loop (Jupyter's does; ``asyncio.run`` inside it fails). ``evaluate`` blocks;
  ``a_evaluate`` awaits the same thread's future, so other tasks go on meanwhile. Ctrl-C (or cancelling the
  awaiting task) cancels this run's judge calls (its own cancel scope: other runs of the process go on); the rows
  judged so far are kept in the row cache.
- **The host.** Nothing of the caller's process is set: no environment variable, collector threshold or
  allocator setting (``recall-bench`` sets its own in ``cli.app.settle_process``).
- **Output.** ``output=None``: the tables (and the row cache) go to a temporary folder read back, then removed;
  nothing is kept. ``output="recall-output"`` (or ``s3://...``): the tables stay there as ``run`` writes them, the
  row cache makes a rerun judge only what changed, and the next run is compared with this one.
- **In-memory data** is written as Parquet in a private per-user folder, ``<state dir>/inputs`` (0700, files 0600),
  named by its bytes and reused only when it holds exactly them (the same data is the same file: an interrupted
  run resumes), in the series ``dataset_name`` (default ``in-memory``); removed once the run committed
  (``cli/memory_copy.py``).
- **Outcomes.** A committed run is returned whatever its status: a failed run, a budget stop or a regression is
  in ``result.run["status"]`` and ``result.comparison``, not raised. Errors before the commit raise as ``run``'s do
  (one :class:`~recall_tasks.errors.RecallBenchError`, or pydantic's ``ValidationError`` for a bad option).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from recall_tasks.errors import BudgetExhausted, ConfigError, IncomparableBaseline, RegressionDetected, RunFailed

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from recall_tasks._sync import CancelScope
    from recall_tasks.config import RunParams
    from recall_tasks.summaries import RunSummary

T = TypeVar("T")

#: The series of in-memory data when ``dataset_name`` is not given.
IN_MEMORY_NAME = "in-memory"


@dataclass
class Evaluation:
    """One committed run: its per-row ``results``, its ``run`` row, and the summary ``run`` prints."""

    results: pa.Table
    run: dict[str, Any]
    summary: RunSummary
    output: str | None

    def to_pandas(self) -> pd.DataFrame:
        """The per-row results as a pandas DataFrame (one row per dataset row); the ``id_metrics`` map of a run with
        document ids is one float column per metric in its place (``recall@1``, ..., ``ndcg@10``: NaN where the row
        was not assessed), not a column of lists of pairs."""
        import pyarrow as pa

        table = self.results
        if "id_metrics" not in table.column_names or not pa.types.is_map(table.schema.field("id_metrics").type):
            return table.to_pandas()
        from recall_tasks.analysis.ids_aggregates import metric_names, values_of

        at = table.column_names.index("id_metrics")
        column = table.column(at)
        table = table.remove_column(at)
        for offset, name in enumerate(metric_names(column)):
            table = table.add_column(at + offset, name, pa.array(values_of(column, name), pa.float64()))
        return table.to_pandas()

    @property
    def comparison(self) -> dict[str, Any] | None:
        """The comparison with the baseline run (verdict, mean delta, CI, flips), None without a baseline."""
        return self.summary.get("comparison")

    def __repr__(self) -> str:
        r = self.run
        return (
            f"Evaluation(run_id={r['run_id']!r}, status={r['status']!r}, rows={r['rows']}, scored={r['scored']}, "
            f"mean_score={r['mean_score']}, pass_rate={r['pass_rate']}, output={self.output!r})"
        )


def evaluate(
    data: Any,
    *,
    output: str | os.PathLike[str] | None = None,
    columns: dict[str, str] | list[str] | None = None,
    prefect: bool = False,
    **options: Any,
) -> Evaluation:
    """Score ``data`` as ``recall-bench run`` does and return its results.

    ``data``: a path or URI (Parquet, JSON lines, CSV; a folder or glob), a pyarrow Table, a pandas DataFrame or a
    list of dicts. ``columns``: ``{"role": "column"}`` or ``["role=column"]`` (``--column``). ``output``: where the
    tables are kept (None: nowhere). ``prefect``: run the Prefect flow (see the module docstring). ``options``:
    any other ``run`` option by its parameter name (``judge="openai"``, ``model=...``, ``max_cost_usd=...``,
    ``label=...``, ``segment_by=[...]``...). Works in a thread that runs an event loop (Jupyter).
    """
    future, scope = _start(data, output, columns, prefect, options)
    try:
        return _wait(future)
    except KeyboardInterrupt:
        _cancel(future, scope)
        raise


async def a_evaluate(
    data: Any,
    *,
    output: str | os.PathLike[str] | None = None,
    columns: dict[str, str] | list[str] | None = None,
    prefect: bool = False,
    **options: Any,
) -> Evaluation:
    """:func:`evaluate`'s async twin: the same work in the same kind of thread, awaited."""
    future, scope = _start(data, output, columns, prefect, options)
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        _cancel(future, scope)
        raise


def _start(
    data: Any, output: Any, columns: Any, prefect: bool, options: dict[str, Any]
) -> tuple[concurrent.futures.Future[Evaluation], CancelScope]:
    """The run in a thread of its own (no event loop there, whatever the caller's thread runs), in a copy of the
    caller's context: ``prefect.settings.temporary_settings`` and the like hold there too; with its cancel scope."""
    from recall_tasks._sync import CancelScope

    future: concurrent.futures.Future[Evaluation] = concurrent.futures.Future()
    scope = CancelScope()

    def work() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(_evaluate(data, output, columns, prefect, options, scope))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread as is
            future.set_exception(exc)

    context = contextvars.copy_context()  # the caller's context vars (Prefect's settings context among them)
    threading.Thread(target=context.run, args=(work,), name="recall-evaluate", daemon=True).start()
    return future, scope


def _wait(future: concurrent.futures.Future[T]) -> T:
    while True:  # short waits: the main thread handles Ctrl-C between them
        try:
            return future.result(timeout=0.1)
        except concurrent.futures.TimeoutError:
            continue


def _cancel(future: concurrent.futures.Future[Any], scope: CancelScope) -> None:
    """Cancel this run's judge calls (and no other run's); the chunk loop then aborts, keeps the judged rows and
    raises."""
    scope.cancel()
    with contextlib.suppress(BaseException):
        future.exception(timeout=30)


def _evaluate(
    data: Any, output: Any, columns: Any, prefect: bool, options: dict[str, Any], scope: CancelScope
) -> Evaluation:
    from recall_tasks.io.columns import parse_column_overrides

    if options.get("batch") and not options.get("batch_wait"):
        raise ConfigError("evaluate(batch=True) waits for its batches: pass batch_wait=True as well")
    given = dict(options)
    with _dataset(data, given) as dataset, _output_folder(output) as out:
        given.update(dataset_uri=dataset.uri, output_uri=out, columns=parse_column_overrides(columns or {}))
        params = _params(given)
        summary = _run(params, prefect, scope)
        if summary["status"] in ("batch_pending", "batch_idle"):  # batch_timeout_s passed before they ended
            raise ConfigError(f"run {summary['run_id']} is pending: its batches are not collected yet")
        dataset.committed()  # nothing left to resume: an in-memory copy goes
        results, run = _read_back(params, summary["run_id"])
    if output is None:
        summary.pop("report_uri", None)  # written in the temporary folder, now removed
    return Evaluation(results=results, run=run, summary=summary, output=None if output is None else out)


@contextlib.contextmanager
def _output_folder(output: Any) -> Iterator[str]:
    if output is not None:
        yield os.fspath(output)
        return
    with tempfile.TemporaryDirectory(prefix="recall-evaluate-") as tmp:
        yield os.path.join(tmp, "recall-output")


@dataclass
class _Dataset:
    """What the run reads (``uri``); ``committed`` when nothing is left to resume (an in-memory copy then goes)."""

    uri: str
    committed: Callable[[], None] = lambda: None


@contextlib.contextmanager
def _dataset(data: Any, options: dict[str, Any]) -> Iterator[_Dataset]:
    """A path as is; in-memory data as its private Parquet copy (``cli/memory_copy.py``), in the series
    ``in-memory``: kept while a run may resume it, removed once the run committed."""
    if isinstance(data, str | os.PathLike):
        yield _Dataset(os.fspath(data))
        return
    import pyarrow as pa

    from recall_tasks.cli.memory_copy import memory_copy, rows_table

    if isinstance(data, pa.Table):
        table = data
    elif isinstance(data, list):
        if not data:
            raise ConfigError("evaluate() got an empty list: no rows to score")
        table = rows_table(data)  # every dict's keys, not the first one's
    elif type(data).__module__.startswith("pandas") and hasattr(data, "to_dict"):
        table = pa.Table.from_pandas(data, preserve_index=False)
    else:
        raise ConfigError(
            "evaluate() reads a path, a pyarrow Table, a pandas DataFrame or a list of dicts, "
            f"not {type(data).__name__}"
        )
    options.setdefault("dataset_name", IN_MEMORY_NAME)
    with memory_copy(table) as copy:
        yield _Dataset(str(copy.path), copy.committed)


def _params(given: dict[str, Any]) -> RunParams:
    """``RunParams`` as ``run`` builds them: the output's format detected when not given."""
    from recall_tasks.config import RunParams
    from recall_tasks.io.results import detect_format
    from recall_tasks.io.storage import StorageConfig

    if given.get("format") is None:
        storage = StorageConfig.from_options(given.get("storage_options") or {})
        given["format"] = "iceberg" if given.get("catalog") else detect_format(given["output_uri"], storage)
    return RunParams.model_validate(given)


def _run(params: RunParams, prefect: bool, scope: CancelScope) -> RunSummary:
    """The flow (``prefect``) or its steps in this process; a committed run's outcome is returned, not raised."""
    try:
        if prefect:
            summary = _run_flow(params, scope)
        else:
            from recall_tasks.pipeline.local_run import run_in_process

            summary = run_in_process(params, scope=scope)
        return cast("RunSummary", summary)  # a pending batch run never returns: batch_wait waits it out
    except (RunFailed, BudgetExhausted, RegressionDetected, IncomparableBaseline) as exc:
        return exc.summary


def _run_flow(params: RunParams, scope: CancelScope) -> Any:
    from recall_tasks.cli.runtime import _prefect_api

    with _prefect_api():
        from recall_tasks.pipeline.flow import watched_benchmark
        from recall_tasks.pipeline.run import NO_OBSERVER

        return watched_benchmark(params, NO_OBSERVER, scope)


def _read_back(params: RunParams, run_id: str) -> tuple[pa.Table, dict[str, Any]]:
    """This run's rows of ``results`` and its overall row of ``runs``, read from the output."""
    import pyarrow.dataset as pads

    from recall_tasks.io.results import ResultStore
    from recall_tasks.io.storage import StorageConfig

    storage = StorageConfig.from_options(params.storage_options)
    store = ResultStore(params.output_uri, storage, params.format, params.catalog, params.namespace)
    this_run = pads.field("run_id") == run_id
    results = store.read_table("results")
    runs = store.read_table("runs")
    assert results is not None and runs is not None  # the run was committed
    overall = runs.to_table(filter=this_run & ~pads.field("segment_column").is_valid()).to_pylist()
    return results.to_table(filter=this_run), overall[0]
