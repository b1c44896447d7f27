"""``recall-bench maintain``: compact, checkpoint or expire, and clean the result tables at ``--output``."""

from __future__ import annotations

from typing import Annotated

import typer

from recall_tasks.cli.common import (
    DEFAULT_OUTPUT,
    FormatOption,
    OutputOption,
    StorageOption,
    _fail,
    _fail_unexpected,
    _store,
    console,
)
from recall_tasks.cli.output import print_rows
from recall_tasks.errors import ConfigError, RecallBenchError
from recall_tasks.io.maintenance import RETENTION_FLOOR_DAYS, SAFETY_MARGIN

COLUMNS = ["table", "data_files_before", "data_files_after", "versions", "files_deleted", "seconds"]

#: ``\b`` keeps click from re-flowing the lines (tests/test_help.py checks they fit 80 columns)
MAINTAIN_EPILOG = f"""\b
Nothing a reader or a run needs is deleted:
  --keep-days under {RETENTION_FLOOR_DAYS:g} is refused without --allow-short-retention;
  even with it, no file younger than {SAFETY_MARGIN.total_seconds() / 3600:g} hour before maintain started is
  deleted (a run committing meanwhile keeps its new files). An output holding
  another format than --format, or two formats, is refused.
\b
Exit codes:
  0  maintained
  2  a usage, configuration or storage error (nothing deleted)
  4  gave up after repeated commit conflicts with runs committing at the
     same time (nothing lost): run it again"""


def maintain(
    output: OutputOption = DEFAULT_OUTPUT,
    format: FormatOption = None,
    storage_option: StorageOption = None,
    keep_days: Annotated[
        float,
        typer.Option(
            min=0,
            help=f"Keep versions and snapshots this many days (a resumed run's check reads them); "
            f"at least {RETENTION_FLOOR_DAYS:g} unless --allow-short-retention",
        ),
    ] = 7.0,
    allow_short_retention: Annotated[
        bool,
        typer.Option(
            "--allow-short-retention",
            help=f"Allow --keep-days under {RETENTION_FLOOR_DAYS:g} (older versions become unreadable; files "
            "written in the last hour before maintain started are still kept)",
        ),
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show the full traceback of an unexpected error")] = False,
) -> None:
    """Compact the tables and drop old versions.

    Delta: compaction, checkpoint, vacuum. Iceberg: compaction, snapshot expiry, orphan files. Best run after
    the nightly run; a run committing meanwhile keeps its rows (a compaction that loses the race is retried).
    """
    from recall_tasks.io.maintenance import MaintenanceConflict, check_retention
    from recall_tasks.io.maintenance import maintain as run_maintenance
    from recall_tasks.io.storage import storage_errors

    try:
        check_retention(keep_days, allow_short_retention)
        store = _store(output, format, storage_option, writes=True)
        if store.format == "parquet":
            raise ConfigError("maintain works on delta and iceberg outputs; parquet files are never rewritten")
        with storage_errors(output, store.storage):
            rows = run_maintenance(store, keep_days, allow_short_retention=allow_short_retention)
        if not rows:
            raise ConfigError(f"no tables under {output} yet")
    except MaintenanceConflict as exc:
        _fail(exc, debug, code=4)
    except RecallBenchError as exc:
        _fail(exc, debug)
    except Exception as exc:  # noqa: BLE001 - a library's error: still one line
        _fail_unexpected(exc, debug)
    print_rows(COLUMNS, ([r[c] for c in COLUMNS] for r in rows), "table", console)
