"""``run --batch`` output while its batches are pending (nothing committed yet), and ``recall-bench batch status``."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from recall_tasks.secrets import redact


def pending_lines(summary: dict[str, Any]) -> list[str]:
    """The pending run's batches, one line each, and how to collect them."""
    batches = summary.get("batches") or []
    lines = [
        f"run {summary['run_id']} pending: {summary.get('batched_rows', 0)} row(s) in {len(batches)} batch(es) "
        f"of the Batch API (submitted {summary.get('submitted_at')}); nothing committed yet"
    ]
    for b in batches:
        counts = b.get("counts") or {}
        done = f", {counts.get('completed', 0)} done, {counts.get('failed', 0)} failed" if counts.get("total") else ""
        lines.append(f"  {b['id']}  {b.get('status')}  {b['requests']} request(s){done}")
    lines.append(f"record: {summary.get('record')}")
    lines.append("rerun the same command to collect the results and finish the run (or add --wait to wait)")
    return lines


def print_pending(summary: dict[str, Any], console: Console) -> None:
    for line in pending_lines(summary):
        console.print(escape(redact(line)), soft_wrap=True, highlight=False)


batch_app = typer.Typer(no_args_is_help=True, help="The Batch API runs under an output (run --batch).")


@batch_app.command("status")
def status(
    output: Annotated[
        str, typer.Option("--output", "-o", envvar="RECALL_OUTPUT", help="Where the tables and _batches/ live")
    ] = "recall-output",
    storage_option: Annotated[
        list[str] | None, typer.Option("--storage-option", help="key=value for the object store (repeatable)")
    ] = None,
) -> None:
    """The batches recorded under --output, as last seen (rerun the run command to check and collect them)."""
    from recall_tasks.io.storage import StorageConfig, filesystem, parse_storage_options

    console, err = Console(), Console(stderr=True)
    try:
        fs, root = filesystem(output, StorageConfig.from_options(parse_storage_options(storage_option or [])))
        folder = f"{root.rstrip('/')}/_batches"
        paths = sorted(p for p in fs.find(folder) if p.endswith(".json")) if fs.exists(folder) else []
    except Exception as exc:  # noqa: BLE001 - one line, as every command
        err.print(f"error: cannot read {output}/_batches: {escape(redact(str(exc)))}", highlight=False)
        raise typer.Exit(code=2) from None
    if not paths:
        console.print(f"no batches recorded under {escape(output)}", highlight=False)
        return
    for path in paths:
        with fs.open(path, "r") as fh:
            record = json.load(fh)
        failures = len(record.get("failures") or {})
        head = (f"run {record.get('run_id')}: {record.get('status')}, submitted {record.get('submitted_at')}"
                + (f", collected {record['collected_at']} ({failures} failed line(s))" if record.get("collected_at")
                   else ""))  # fmt: skip
        console.print(escape(redact(head)), soft_wrap=True, highlight=False)
        for part in record.get("parts") or []:
            batch_id, count = part.get("batch_id") or "(not created)", len(part["custom_ids"])
            line = f"  {batch_id}  {part.get('status')}  {count} request(s)"
            console.print(escape(redact(line)), soft_wrap=True, highlight=False)
