"""Data in Markdown artifacts (Prefect renders them, raw HTML included): escaped so it stays text.

Dataset text (statements, errors, row ids, URIs, labels) must never become markup: a ``<script>`` or an
``<img onerror=…>``, an image beacon ``![x](http://…)`` every viewer would fetch, a link, a heading, a pipe that
adds table cells or a newline that adds table rows. Three helpers, used by every Markdown view (``summary.py``,
``comparison.py``):

- :func:`md_text`: text for a paragraph, list item or table cell, never at the start of a line. ``&``, ``<``,
  ``>`` become entities; the characters that make emphasis, code, links, images, headings, lists, tables,
  strikethrough or math (``\\ ` * _ { } [ ] ( ) # + - ! | ~ ^ $``) are backslash-escaped (CommonMark renders
  ``\\*`` as ``*``); line breaks, tabs and other control characters become spaces, so a value is one line.
- :func:`md_code`: an inline code span (row ids, URIs): inside one nothing is markup and HTML is shown as
  text; the fence is one backtick longer than the longest run of backticks in the value (padded with spaces
  when the value starts or ends with a backtick or a space); line breaks become spaces; in a table cell
  (``table=True``) ``|`` is escaped (a table splits cells on it even inside code, and drops the backslash).
- :func:`md_url`: a link target (``[text](…)``: the output's URI, a presigned URL). Percent-encoded but for
  letters, digits and ``-._~:/?#[]@!$&*+,;=%``: a space, ``(``, ``)``, ``<``, ``>``, ``"``, ``'``, a backtick, a
  backslash, a control character or any non-ASCII one cannot end the target or add markup, while ``s3://b/x``,
  ``file:///tmp/out/r.html`` and a presigned URL's query (already encoded: ``%`` is kept) stay the same link.

``limit`` cuts the value (before escaping, so an escape is never cut in half) and marks the cut with ``…``.
"""

from __future__ import annotations

import re
from urllib.parse import quote

_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]+")
_PUNCT = re.compile(r"([\\`*_{}\[\]()#+\-!|~^$])")
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_BACKTICKS = re.compile(r"`+")
#: What a link target keeps as it is (:func:`md_url`); ``quote`` always keeps letters, digits and ``-._~``.
_URL_SAFE = ":/?#[]@!$&*+,;=%"


def _clip(value: object, limit: int | None) -> str:
    text = _CONTROL.sub(" ", "" if value is None else str(value))
    return text[:limit] + "…" if limit is not None and len(text) > limit else text


def md_text(value: object, limit: int | None = None) -> str:
    """``value`` as literal Markdown text on one line (see the module docstring)."""
    text = _clip(value, limit)
    text = "".join(_ENTITIES.get(ch, ch) for ch in text)
    return _PUNCT.sub(r"\\\1", text)


def md_code(value: object, limit: int | None = None, *, table: bool = False) -> str:
    """``value`` as a one-line inline code span that no content can close early (see the module docstring)."""
    text = _clip(value, limit)
    if table:
        text = text.replace("|", "\\|")
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text[:1] in ("`", " ") or text[-1:] in ("`", " ") else ""  # CommonMark strips one space each side
    return f"{fence}{pad}{text}{pad}{fence}"


def md_url(uri: str) -> str:
    """``uri`` as a Markdown link target nothing in it can close or turn into markup (see the module docstring)."""
    return quote(uri, safe=_URL_SAFE)
