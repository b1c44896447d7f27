"""``recall-bench calibrate LABELS``: how well each judge agrees with human labels, side by side.

A plain function with Typer's annotations; :mod:`recall_tasks.cli.app` registers it. The logic is
:mod:`recall_tasks.pipeline.calibrate` (judging through the run's scoring, cache and budget), the figures
:mod:`recall_tasks.analysis.agreement`, the report :mod:`recall_tasks.reports.calibration`.

Order, so that bad input costs nothing: the options, the labelled set (``io/labels.py``), the output and every
judge (built and probed like a run's: a refused key or an unreachable endpoint stops here) are checked first,
each failure one ``error:`` line and exit 2, before any judge call or write. Then every judge judges the set;
then the ``calibrations`` rows are committed in one commit and the reports written. Exit 0, or 4 when a judge
left rows without verdicts (the figures are recorded with status ``failed``; they are not the set's). Ctrl-C
(SIGINT) or SIGTERM while judging: the judge calls are cancelled, nothing is recorded, the rows judged so far stay
in the verdict cache, exit 130 (143).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from recall_tasks._logging import inert
from recall_tasks.cli.common import (
    DEBUG_HELP,
    DEFAULT_OUTPUT,
    FormatOption,
    OutputOption,
    StorageOption,
    _detect_format,
    _split_storage_options,
    console,
    err,
)
from recall_tasks.config import RunParams
from recall_tasks.judges.capabilities import Preflighted

_F = RunParams.model_fields


def _help(name: str) -> str:
    return str(_F[name].description)


def calibrate(
    labels: Annotated[
        str,
        typer.Argument(
            help="Labelled set: one .jsonl or .parquet file (a dataset's columns plus labels; docs/calibration.md)"
        ),
    ],
    judge: Annotated[
        list[str] | None,
        typer.Option(
            "--judge", help="lexical | openai | openai:MODEL (repeatable: the judges side by side); default: lexical"
        ),
    ] = None,
    model: Annotated[
        list[str] | None, typer.Option("--model", help="An OpenAI judge model (repeatable; same as --judge openai:M)")
    ] = None,
    metric: Annotated[
        str, typer.Option(help="contextual_recall | context_coverage: rows without a task column")
    ] = "contextual_recall",
    column: Annotated[list[str] | None, typer.Option("--column", help="role=name column mapping (repeatable)")] = None,
    output: OutputOption = DEFAULT_OUTPUT,
    format: FormatOption = None,
    catalog: Annotated[str | None, typer.Option(help=_help("catalog"))] = None,
    namespace: Annotated[str | None, typer.Option(help=_help("namespace"))] = None,
    storage_option: StorageOption = None,
    base_url: Annotated[str | None, typer.Option(help=_help("base_url"))] = None,
    max_concurrency: Annotated[int, typer.Option(help=_help("max_concurrency"))] = _F["max_concurrency"].default,
    rpm: Annotated[int | None, typer.Option("--rpm", help="Requests per minute, per judge (this process)")] = None,
    tpm: Annotated[int | None, typer.Option("--tpm", help="Tokens per minute, per judge (this process)")] = None,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help=_help("timeout_s"))] = _F["timeout_s"].default,
    max_retries: Annotated[int, typer.Option(help=_help("max_retries"))] = _F["max_retries"].default,
    price: Annotated[list[str] | None, typer.Option("--price", help=_help("prices"))] = None,
    max_cost_usd: Annotated[
        float | None, typer.Option(help="Stop judging once the command (all judges) has spent this much")
    ] = None,
    max_requests: Annotated[
        int | None, typer.Option(help="Stop judging after this many requests (all judges together)")
    ] = None,
    cache: Annotated[bool, typer.Option("--cache/--no-cache", help=_help("cache"))] = True,
    refresh_cache: Annotated[bool, typer.Option("--refresh-cache", help=_help("refresh_cache"))] = False,
    cache_uri: Annotated[str | None, typer.Option(help=_help("cache_uri"))] = None,
    resamples: Annotated[int, typer.Option(min=100, help="Bootstrap resamples of the 95 % intervals")] = 2000,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap (same seed, same intervals)")] = 0,
    show: Annotated[
        int, typer.Option("--show-disagreements", min=0, help="Print at most this many disagreements per judge")
    ] = 20,
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
) -> None:
    """Measure judges' agreement with human labels.

    Accuracy, Cohen's kappa, TPR/TNR, row-score MAE and Spearman, each with a 95 % bootstrap interval, per task
    and category; the confusion matrix, the disagreements with the judge's reason and the cost. Recorded in the
    calibrations table (see `query`) and a Markdown and HTML report under --output/reports/. Exit 0; 2 on bad
    input (nothing judged or written); 4 when a judge left rows without verdicts (recorded as failed).
    """
    import signal

    from recall_tasks._sync import Cancelled
    from recall_tasks.cli.run_flow import one_line_errors
    from recall_tasks.cli.runtime import _interrupts, _is_interrupt

    with one_line_errors(debug), _interrupts() as state:
        try:
            cal, store = _prepare_and_judge(
                labels, judge or [], model or [], metric, column or [], output, format, catalog, namespace,
                storage_option or [], base_url, max_concurrency, rpm, tpm, timeout_s, max_retries, price or [],
                max_cost_usd, max_requests, cache, refresh_cache, cache_uri, resamples, seed,
            )  # fmt: skip
        except BaseException as exc:  # an interrupt: nothing recorded, exit 130 (143 on SIGTERM)
            if not (_is_interrupt(exc) or isinstance(exc, Cancelled)) and state["signal"] is None:
                raise
            sig = int(state["signal"] or signal.SIGINT)
            err.print("interrupted: nothing recorded; rerun the same command (rows judged so far are cached)")
            raise typer.Exit(code=128 + sig) from None
        from recall_tasks.reports.calibration import blocks, render_text, write_reports

        store.append_calibration(cal.calibration_id, cal.labelled.name, cal.table_rows())
        uris = write_reports(store, cal)
    console.print(inert(render_text(blocks(cal, show))), markup=False, highlight=False, soft_wrap=True)
    err.print(f"calibration {cal.calibration_id} recorded in the calibrations table under {output}", markup=False)
    for uri in uris:
        err.print(f"report: {uri}", markup=False, highlight=False, soft_wrap=True)
    if cal.failed:
        failed = [j.spec.name for j in cal.judges if j.status == "failed"]
        err.print(
            f"error: {', '.join(failed)} left rows without verdicts: those figures are not the set's "
            "(recorded with status failed)",
            markup=False, highlight=False, soft_wrap=True,
        )  # fmt: skip
        raise typer.Exit(code=4)


def _prepare_and_judge(
    labels: str, judges: list[str], models: list[str], metric: str, column: list[str], output: str,
    format: str | None, catalog: str | None, namespace: str | None, storage_option: list[str],
    base_url: str | None, max_concurrency: int, rpm: int | None, tpm: int | None, timeout_s: float,
    max_retries: int, price: list[str], max_cost_usd: float | None, max_requests: int | None, cache: bool,
    refresh_cache: bool, cache_uri: str | None, resamples: int, seed: int,
) -> tuple[Any, Any]:  # fmt: skip
    from recall_tasks.errors import ConfigError
    from recall_tasks.fleet.guards import Budget
    from recall_tasks.io.cache import RowVerdictCache
    from recall_tasks.io.columns import parse_column_overrides
    from recall_tasks.io.labels import load_labels
    from recall_tasks.io.results import FORMATS, ResultStore, check_format
    from recall_tasks.io.storage import StorageConfig, join_uri
    from recall_tasks.pipeline.calibrate import calibrate, parse_judges
    from recall_tasks.pipeline.checks import check_output_name, check_priced
    from recall_tasks.pipeline.components import make_judge, release_judge

    if metric not in ("contextual_recall", "context_coverage"):
        raise ConfigError(f"--metric must be contextual_recall or context_coverage, got {metric!r}")
    plain = _split_storage_options(storage_option)
    fmt = format or ("iceberg" if catalog else _detect_format(output, storage_option))
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be delta, parquet or iceberg, got {fmt!r}")
    check_format(output, StorageConfig.from_options(plain), fmt, writes=True)  # one output, one format
    check_output_name(output, fmt)  # one the format's writer takes: refused now, not after the judging
    common: dict[str, Any] = {
        "dataset_uri": labels, "output_uri": output, "metric": metric, "base_url": base_url,
        "max_concurrency": max_concurrency, "requests_per_minute": rpm, "tokens_per_minute": tpm,
        "timeout_s": timeout_s, "max_retries": max_retries, "prices": price, "max_cost_usd": max_cost_usd,
        "max_requests": max_requests, "cache": cache, "refresh_cache": refresh_cache, "cache_uri": cache_uri,
        "format": fmt, "catalog": catalog, "namespace": namespace, "storage_options": plain,
    }  # fmt: skip
    default = RunParams.model_validate(common)
    specs = parse_judges(judges, models, default)
    storage = StorageConfig.from_options(plain)
    labelled = load_labels(labels, storage, metric, parse_column_overrides(column))
    store = ResultStore(output, storage, fmt, catalog, namespace)  # type: ignore[arg-type]
    built: list[tuple[Any, RunParams, Any]] = []
    try:
        for spec in specs:
            params = RunParams.model_validate({**common, "judge": spec.judge, "model": spec.model if
                                               spec.judge == "openai" else default.model})  # fmt: skip
            judge = make_judge(params)
            built.append((spec, params, judge))
            note = judge.preflight() if isinstance(judge, Preflighted) else None
            if note:
                err.print(f"note: {spec.name}: {note}", markup=False, highlight=False, soft_wrap=True)
            check_priced(params, judge)
        row_cache = None
        if cache:
            row_cache = RowVerdictCache(cache_uri or join_uri(output, "cache"), storage, read=not refresh_cache)
        budget = Budget(max_requests, max_cost_usd, max_in_flight=max_concurrency)
        try:
            cal = calibrate(labelled, built, row_cache, budget, resamples=resamples, seed=seed)
        except BaseException:
            if row_cache is not None:
                row_cache.flush()  # interrupted or failed: what was judged is kept for the rerun
            raise
        if row_cache is not None:
            row_cache.close()
    finally:
        for _, _, j in built:
            release_judge(j)
    return cal, store
