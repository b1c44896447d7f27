"""``recall-bench maintain``: compact, checkpoint or expire, and clean the result tables at ``--output``."""

from __future__ import annotations

from typing import Annotated

import typer

from recall_tasks.cli.common import DEFAULT_OUTPUT, FormatOption, OutputOption, StorageOption, _fail, _store, console
from recall_tasks.cli.output import print_rows
from recall_tasks.errors import ConfigError, RecallBenchError

COLUMNS = ["table", "data_files_before", "data_files_after", "versions", "files_deleted", "seconds"]


def maintain(
    output: OutputOption = DEFAULT_OUTPUT,
    format: FormatOption = None,
    storage_option: StorageOption = None,
    keep_days: Annotated[
        float, typer.Option(min=0, help="Keep versions and snapshots this many days (a resumed run's check reads them)")
    ] = 7.0,
) -> None:
    """Compact the tables and drop old versions.

    Delta: compaction, checkpoint, vacuum. Iceberg: compaction, snapshot expiry, orphan files. Run it while no
    run commits to the output (e.g. after the nightly run).
    """
    from recall_tasks.io.maintenance import maintain as run_maintenance

    try:
        store = _store(output, format, storage_option)
        if store.format == "parquet":
            raise ConfigError("maintain works on delta and iceberg outputs; parquet files are never rewritten")
        rows = run_maintenance(store, keep_days)
        if not rows:
            raise ConfigError(f"no tables under {output} yet")
    except RecallBenchError as exc:
        _fail(exc)
    print_rows(COLUMNS, ([r[c] for c in COLUMNS] for r in rows), "table", console)
