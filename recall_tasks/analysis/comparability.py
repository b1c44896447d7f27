"""Whether two runs' scores may be compared at all: the settings that must match, the share of rows that must pair.

Used by the baseline selection (``latest`` prefers a comparable run) and by the comparison (an incomparable pair
gets the verdict ``incomparable`` with the reasons). The rule is in docs/regression.md, "Comparable or not".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from recall_tasks.io.datasets import ROW_ID_COLUMN_IDENTITY
from recall_tasks.judges.base import model_family

__all__ = [
    "COMPARABLE_KEYS", "COMPARABLE_KEYS_V2", "MIN_PAIRED_SHARE", "incomparable_reasons", "paired_share_reason",
    "replied_reason",
]  # fmt: skip

#: Run fields that must be equal for a verdict; the second group is recorded only since row identity v2.
COMPARABLE_KEYS = ("dataset", "metric", "judge_model", "prompt_version", "threshold", "scale")
COMPARABLE_KEYS_V2 = ("dataset_id", "units", "judge", "schema_version", "splitter_version", "judge_config")

_COMPARISON_ORDER = ("dataset", "dataset_id", "metric", "units", "judge", "judge_model", "prompt_version",
                     "schema_version", "splitter_version", "judge_config", "threshold", "scale")  # fmt: skip
# a difference in a key on the right is implied by one on the left: only the first is named
_IMPLIED_BY = {
    "dataset_id": {"dataset"},
    "judge_model": {"judge"},
    "prompt_version": {"judge", "judge_model"},
    "schema_version": {"judge", "judge_model"},
    "judge_config": {"judge", "judge_model", "prompt_version", "schema_version", "splitter_version", "metric"},
}

#: A difference in one of these explains a change of the canary's agreement: judge drift is then not named too.
_JUDGE_KEYS = {"metric", "units", "judge", "judge_model", "prompt_version", "schema_version", "splitter_version",
               "judge_config"}  # fmt: skip

MIN_PAIRED_SHARE = 0.9
"""Below this share of the baseline's rows matched by row id, the comparison is incomparable."""


def incomparable_reasons(current_run: Mapping[str, Any], baseline_run: Mapping[str, Any]) -> list[str]:
    """What makes two runs' scores incomparable (empty when they are comparable); see docs/regression.md.

    Judge drift (:mod:`~recall_tasks.analysis.drift`: both runs' canary agreement, same labelled set, moved beyond
    its interval) is one of the reasons, unless a judge setting differs already.
    """
    reasons = []
    differs = set()
    for key in _COMPARISON_ORDER:
        a, b = current_run.get(key), baseline_run.get(key)
        if key in COMPARABLE_KEYS_V2 and b is None:
            continue  # the baseline predates this field
        if key == "dataset_id" and str(a or "") == f"name:{baseline_run.get('dataset')}":
            continue  # --dataset-name NAME joins the runs recorded as NAME at any location (baseline._series)
        if a != b:
            differs.add(key)
            if not differs & _IMPLIED_BY.get(key, set()):  # "judge differs" says it all: not also its model
                reasons.append(f"{key} differs (current {a!r}, baseline {b!r})")
    if current_run.get("row_identity") != baseline_run.get("row_identity"):
        if baseline_run.get("row_identity") is None:
            if current_run.get("row_identity") != ROW_ID_COLUMN_IDENTITY:
                reasons.append(
                    "the baseline was recorded before row identity v2 (its row ids hashed the retrieved contexts, "
                    "so they cannot pair with this run's); compare with a run recorded since"
                )
        else:
            reasons.append(
                f"row_identity differs (current {current_run.get('row_identity')!r}, "
                f"baseline {baseline_run.get('row_identity')!r})"
            )
    if not differs & {"judge", "judge_model"}:
        replied = replied_reason(current_run, baseline_run)
        if replied is not None:
            reasons.append(replied)
    if not differs & _JUDGE_KEYS and current_run.get("canary_id"):
        from recall_tasks.analysis.drift import judge_drift  # numpy: not imported by the CLI's start-up

        drift = judge_drift(current_run, baseline_run)
        if drift is not None and drift.drifted:
            reasons.append(drift.reason())
    return reasons


def replied_reason(current_run: Mapping[str, Any], baseline_run: Mapping[str, Any]) -> str | None:
    """Why the models that replied make two runs incomparable, or None: the families (names without a snapshot date)
    of the runs' ``reply_models`` differ (a gateway fell back to another model for some rows of one run); or this run
    has substituted rows and the baseline, recorded before the column, does not say which models replied."""
    now, then = current_run.get("reply_models"), baseline_run.get("reply_models")
    if now and then:
        ours, theirs = sorted({model_family(m) for m in now}), sorted({model_family(m) for m in then})
        if ours == theirs:
            return None
        return f"the models that replied differ (current {ours}, baseline {theirs}): what judged the rows changed"
    substituted = current_run.get("substituted_rows") or 0
    if substituted and then is None:
        return (
            f"{substituted} rows of this run were judged by another model than {current_run.get('judge_model')!r} "
            f"(replies from {sorted(now or [])}); the baseline does not record which models replied"
        )
    return None


def paired_share_reason(n_matched: int, n_baseline: int, n_current: int) -> str | None:
    """Why too few of the baseline's ``n_baseline`` rows pair by row id (below :data:`MIN_PAIRED_SHARE`), or None.

    ``n_matched`` rows of the current run's ``n_current`` have a row id in the baseline.
    """
    if not n_baseline or n_matched >= MIN_PAIRED_SHARE * n_baseline:
        return None
    return (
        f"only {n_matched} of the baseline's {n_baseline} rows ({n_matched / n_baseline:.0%}) "
        f"pair with this run's by row id (at least {MIN_PAIRED_SHARE:.0%} needed); {n_current - n_matched}"
        " rows are new in this run"
    )
