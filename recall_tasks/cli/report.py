"""``recall-bench report``: the HTML report of a recorded run, next to the tables or in a local file.

A plain function with Typer's annotations; :mod:`recall_tasks.cli.app` registers it on the ``recall-bench`` app.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from recall_tasks.cli.common import DEFAULT_OUTPUT, FormatOption, OutputOption, StorageOption, _fail, _store, console
from recall_tasks.errors import ConfigError, RecallBenchError


def report(
    run_id: Annotated[str, typer.Argument(help="The run to report on, or latest (the last run started)")],
    output: OutputOption = DEFAULT_OUTPUT,
    format: FormatOption = None,
    storage_option: StorageOption = None,
    to: Annotated[
        Path | None, typer.Option("--to", help="Write the HTML to this local file (or folder) instead of --output")
    ] = None,
) -> None:
    """Write a run's self-contained HTML report; print where.

    The report goes next to the tables, or to a local path with --to.
    """
    from recall_tasks.reports.html import render_run_report, write_report

    try:
        store = _store(output, format, storage_option)
        if run_id == "latest":
            run_id = latest_run_id(store, output)
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


def latest_run_id(store: Any, output: str) -> str:
    """The run id of the run started last under ``output`` (``recall-bench report latest``)."""
    runs = store.read_table("runs")
    if runs is None:
        raise ConfigError(f"no runs recorded under {output}")
    table = runs.to_table(columns=["run_id", "started_at"])
    if table.num_rows == 0:
        raise ConfigError(f"no runs recorded under {output}")
    return str(table.sort_by([("started_at", "descending"), ("run_id", "descending")]).column("run_id")[0].as_py())
