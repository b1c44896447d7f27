"""What the flow shows in the Prefect UI: artifact keys, the summary table, the report link.

Decisions:
- Artifact keys carry the dataset and the metric (``recall-summary-golden-contextual-recall``): Prefect groups
  an artifact's history by key, so one key per series keeps datasets from mixing in one history.
- The summary table keeps numbers as numbers (the UI sorts and formats them); only timestamps become text.
- The HTML report link must open in a browser: ``file://`` for a local output; for object storage, a presigned
  https URL when the filesystem can sign one (s3fs can; valid :data:`LINK_EXPIRY_S`, 7 days, the SigV4 maximum,
  with the expiry written in the link text), else the storage URI as it is.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from recall_tasks.io.storage import join_uri, normalize_uri
from recall_tasks.summaries import RunRow

LINK_EXPIRY_S = 7 * 24 * 3600

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


def browser_link(store: Any, *parts: str) -> tuple[str, str]:
    """A URL a browser can open for the output's file at ``parts``, and a note on how long it works."""
    uri = join_uri(store.output_uri, *parts)
    norm = normalize_uri(uri)
    if "://" not in norm:
        return "file://" + norm, "local file"
    sign = getattr(store.fs, "sign", None)
    if sign is not None:
        try:
            url = str(sign(store._path(*parts), expiration=LINK_EXPIRY_S))
        except (NotImplementedError, ValueError, TypeError, OSError):
            url = ""
        if url.startswith("http"):
            expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=LINK_EXPIRY_S)
            return url, f"presigned link, valid until {expires:%Y-%m-%d %H:%M} UTC"
    return uri, "storage URI (open it with your object-store console)"
