"""Log lines that data cannot forge: values logged from datasets (URIs, labels, reasons) stay on one line.

A dataset path or label holding a newline could otherwise start a fake ``ERROR`` line in the run's log, which
Prefect stores and shows. The filter escapes CR and LF in a record's string arguments (never in the message
template), so every logged value reads as written, ``\\n`` included.
"""

from __future__ import annotations

import logging


class OneLineArgs(logging.Filter):
    """Escape ``\\r`` and ``\\n`` in the string arguments of every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(isinstance(a, str) and ("\n" in a or "\r" in a) for a in args):
            record.args = tuple(_one_line(a) if isinstance(a, str) else a for a in args)
        return True


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


def install(*names: str) -> None:
    """Add the filter to the named loggers (once each)."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, OneLineArgs) for f in logger.filters):
            logger.addFilter(OneLineArgs())
