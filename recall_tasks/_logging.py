"""Log lines and terminal output that data cannot forge or take over.

A dataset path or label holding a newline could otherwise start a fake ``ERROR`` line in the run's log, which
Prefect stores and shows. The filter escapes CR and LF in a record's string arguments (never in the message
template), so every logged value reads as written, ``\\n`` included; it escapes every other control character
too (below).

A value holding an escape sequence (``ESC[2J`` clears the screen, ``ESC]0;…BEL`` sets the window title,
``ESC]8;;URL`` makes a hyperlink, ``ESC[31m`` colours what follows) would be run by the terminal that shows it:
Rich drops BEL, BS, VT, FF and CR but passes ESC. :func:`inert` shows every C0 control character but line breaks
and tabs, DEL and every C1 control character (``\\x9b`` is a one-byte CSI) as a Python-style escape (``\\x1b``),
so the value reads as written and does nothing. It is applied to what the CLI prints for people (tables, the
run summary, verdict lines, warnings, errors) and to csv, markdown and json written to a terminal; written to a
pipe or a file those keep the exact bytes.
"""

from __future__ import annotations

import logging
import re

__all__ = ["OneLineArgs", "inert", "install"]

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # not \t (\x09) and \n (\x0a): tables keep lines
_CONTROL_ALL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    ch = m.group()
    return _NAMED.get(ch) or f"\\x{ord(ch):02x}"


def inert(text: str, *, lines: bool = True) -> str:
    """``text`` with its control characters shown as escapes (``\\x1b``), so a terminal runs none of them.

    ``lines``: line breaks and tabs are kept (a table cell, a multi-line message); False escapes them too
    (``\\n``, ``\\t``: one line). Text without a control character is returned as it is.
    """
    pattern = _CONTROL if lines else _CONTROL_ALL
    return pattern.sub(_escape, text) if pattern.search(text) else text


class OneLineArgs(logging.Filter):
    """Escape ``\\r``, ``\\n`` and every other control character in the string arguments of every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(isinstance(a, str) and _CONTROL_ALL.search(a) for a in args):
            record.args = tuple(_one_line(a) if isinstance(a, str) else a for a in args)
        return True


def _one_line(text: str) -> str:
    return inert(text, lines=False)


def install(*names: str) -> None:
    """Add the filter to the named loggers (once each)."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, OneLineArgs) for f in logger.filters):
            logger.addFilter(OneLineArgs())
