"""Figures in the human reports (the Markdown views and the HTML report): one number format, one mark for none."""

from __future__ import annotations

__all__ = ["DASH", "fmt_number"]

DASH = "–"
"""Shown for a figure that has no value (an en dash)."""


def fmt_number(value: float | None, spec: str) -> str:
    """``value`` formatted with the format spec ``spec`` (``".4f"``, ``"+.3f"``, ``".1%"``), :data:`DASH` for None."""
    return DASH if value is None else format(value, spec)
