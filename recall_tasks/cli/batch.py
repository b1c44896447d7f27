"""What ``recall-bench run --batch`` prints while its batches are pending (the run is not committed yet)."""

from __future__ import annotations

from typing import Any

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
