"""The history table narrowed to a terminal: the verdict shortened first, then columns dropped (``history_fit``)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from recall_tasks.cli.output import width_needed

#: Dropped one by one, in this order, until the table fits a narrow terminal (``history_fit``); run_id, label, mean,
#: pass rate and verdict stay (a dropped status other than completed goes into the verdict). ``started`` goes early:
#: the run id starts with the same UTC time.
HISTORY_DROP_ORDER = ("judge", "dataset", "started", "95 % CI", "rows", "status")

_PARENTHESIS = re.compile(r" \((?!--output-format)[^()]*\)")
_BARE_INCOMPARABLE = re.compile(r"\bincomparable: .*$")


def _narrow_verdict(cell: str) -> str:
    """A verdict cell for a narrow terminal: no baseline run id, no parentheses, an incomparable run's reasons kept
    by name (``incomparable vs <id>: judge differs (current 'a', baseline 'b')`` -> ``incomparable: judge differs``:
    the bare word left a reader no clue which setting changed)."""
    if cell == "first of series":
        return "first"
    verdict, _, rest = cell.partition(" vs ")
    reason = rest.partition(": ")[2]
    cell = f"{verdict}: {reason}" if reason else verdict
    while (shorter := _PARENTHESIS.sub("", cell)) != cell:  # nested ones from the inside out
        cell = shorter
    return cell


def history_fit(columns: Sequence[str], cells: list[list[str]], width: int) -> tuple[list[str], list[list[str]]]:
    """The history table narrowed to ``width`` terminal columns, so no cell is folded into pieces.

    First the verdict loses its baseline run id (each run's baseline is usually the row above; ``--output-format
    csv`` has it; "first of series" becomes "first", parentheses go; an incomparable run keeps why: "incomparable:
    judge differs"), then columns go in :data:`HISTORY_DROP_ORDER` while the table is still too wide (the status
    last, kept in the verdict when it is not ``completed``); narrower still, an incomparable run's reasons go too.
    """
    names, rows = list(columns), [list(r) for r in cells]
    if width_needed(names, rows) <= width:
        return names, rows
    v = names.index("verdict")
    for row in rows:
        row[v] = _narrow_verdict(row[v])
    for drop in HISTORY_DROP_ORDER:
        if width_needed(names, rows) <= width:
            break
        i = names.index(drop)
        del names[i]
        for row in rows:
            gone = row.pop(i)
            if drop == "status" and gone not in ("completed", ""):
                row[names.index("verdict")] = f"{gone}: {row[names.index('verdict')]}"
    if width_needed(names, rows) > width:  # still too wide with every column gone: the bare verdict word
        v = names.index("verdict")
        for row in rows:
            row[v] = _BARE_INCOMPARABLE.sub("incomparable", row[v])
    return names, rows
