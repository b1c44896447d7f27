"""What the flow shows in the Prefect UI: artifact keys, the summary table, the report link.

Decisions:
- Artifact keys carry the dataset and the metric (``recall-summary-golden-contextual-recall``): Prefect groups
  an artifact's history by key, so one key per series keeps datasets from mixing in one history.
- The summary table keeps numbers as numbers (the UI sorts and formats them); only timestamps become text.
- The HTML report link: ``file://`` for a local output; for object storage, the storage URI (``s3://...``) by
  default. A presigned https URL grants read access to anyone who has it, and Prefect keeps artifacts for every
  user of the workspace to read (with the access key id in it): it is opt-in, ``RECALL_BENCH_REPORT_LINK_S``
  seconds (at most :data:`LINK_EXPIRY_MAX_S`, 7 days, the SigV4 maximum; e.g. 3600), the expiry written in the
  link text, and only where the filesystem can sign (s3fs can). Events and alerts never carry one. A local
  path is percent-encoded into its ``file://`` URL; ``publish`` makes every link target Markdown-safe.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any
from urllib.parse import quote

from recall_tasks.io.storage import is_local, join_uri, normalize_uri
from recall_tasks.summaries import RunRow

#: The longest a presigned report link may live (SigV4's maximum).
LINK_EXPIRY_MAX_S = 7 * 24 * 3600

SUMMARY_FIELDS = [
    "run_id", "status", "status_reason", "dataset", "label", "metric", "judge", "judge_model", "rows", "scored",
    "errors", "skipped", "cached", "mean_score", "ci_low", "ci_high", "median_score", "p10_score", "pass_rate",
    "error_rate", "requests", "prompt_tokens", "completion_tokens", "cost_usd", "wall_seconds",
]  # fmt: skip


def artifact_key(kind: str, dataset: str, metric: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) for one kind of artifact of one series."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"recall-{kind}-{dataset}-{metric}".lower()).strip("-")
    return slug[:200]


def summary_table(summary: RunRow) -> list[dict[str, Any]]:
    """The run summary as field/value rows, numbers kept as numbers (timestamps as ISO text)."""
    rows = []
    for key in SUMMARY_FIELDS:
        value = summary.get(key)
        if isinstance(value, dt.datetime | dt.date):
            value = value.isoformat()
        rows.append({"field": key, "value": value})
    return rows


def report_link_seconds() -> int | None:
    """``RECALL_BENCH_REPORT_LINK_S``: how long a presigned report link lives, or None (no presigned link).

    Checked before a run judges anything (``steps.check_run``): a bad value is a :class:`ConfigError`.
    """
    from recall_tasks.errors import ConfigError
    from recall_tasks.settings import settings

    raw = settings().report_link_s
    if raw is None:
        return None
    try:
        seconds = int(raw)
    except ValueError:
        seconds = 0
    if not 1 <= seconds <= LINK_EXPIRY_MAX_S:
        raise ConfigError(
            f"RECALL_BENCH_REPORT_LINK_S={raw!r}: expected whole seconds from 1 to {LINK_EXPIRY_MAX_S} (7 days), "
            "e.g. 3600; unset it to keep presigned links out of the Prefect artifacts"
        )
    return seconds


def browser_link(store: Any, *parts: str) -> tuple[str, str]:
    """A link to the output's file at ``parts`` for the Prefect UI, and a note on what it is (module docstring)."""
    uri = join_uri(store.output_uri, *parts)
    if is_local(uri):  # a file:// URL: a ``%`` or ``#`` in a folder name percent-encoded
        return "file://" + quote(normalize_uri(uri), safe="/"), "local file"
    seconds = report_link_seconds()
    sign = getattr(store.fs, "sign", None)
    if seconds is not None and sign is not None:
        try:
            url = str(sign(store.path(*parts), expiration=seconds))
        except (NotImplementedError, ValueError, TypeError, OSError):
            url = ""
        if url.startswith("http"):
            expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)
            return url, f"presigned link, valid until {expires:%Y-%m-%d %H:%M} UTC"
    return uri, "storage URI; RECALL_BENCH_REPORT_LINK_S gives a presigned link"
