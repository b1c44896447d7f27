"""The run parameters of the id-based retrieval metrics (issue 41): cut-offs, chunk-to-document pattern, qrels,
the verdict metric. A base of :class:`recall_tasks.config.RunParams` (every field is a CLI option and a deployment
parameter); what they mean is in docs/usage.md, "Id-based retrieval metrics"."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

ID_METRIC_NAMES = ("recall", "precision", "hit_rate", "mrr", "ndcg")


class IdParams(BaseModel):
    """The id metrics' parameters (all optional: a run whose dataset has no id columns ignores them)."""

    k: str = Field(
        "1,5,10",
        pattern=r"^\s*\d+(\s*,\s*\d+)*\s*$",
        description="Cut-offs of the id metrics (recall@k, precision@k, hit_rate@k, mrr@k, ndcg@k), comma-separated",
    )
    id_pattern: str | None = Field(
        None,
        description="Regex with one group: a chunk id's document id (e.g. '^(.+)::'), applied before the id metrics",
    )
    qrels_uri: str | None = Field(
        None,
        description="Relevant document ids per row: Parquet (query_id, doc_id[, relevance]) or TREC qrels text "
        "(query_id 0 doc_id relevance), joined to the rows by row id",
    )
    verdict_metric: str = Field(
        "recall@10",
        pattern=r"^(recall|precision|hit_rate|mrr|ndcg)@[1-9][0-9]*$",
        description="The id metric deciding a retrieval_ids run's verdict (its k must be one of --k)",
    )

    @field_validator("id_pattern")
    @classmethod
    def _one_group(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            groups = re.compile(value).groups
        except re.error as exc:
            raise ValueError(f"--id-pattern {value!r} is not a regular expression: {exc}") from None
        if groups != 1:
            raise ValueError(f"--id-pattern {value!r} must have exactly one group (the document id), it has {groups}")
        return value

    @model_validator(mode="after")
    def _retrieval_ids_options(self) -> Any:
        """A ``retrieval_ids`` run has no judge: the options that need one are refused, never ignored."""
        if getattr(self, "metric", None) != "retrieval_ids":
            return self
        for name, option in (("batch", "--batch"), ("canary", "--canary")):
            if getattr(self, name, None):
                raise ValueError(f"{option} needs a judge and --metric retrieval_ids has none")
        if getattr(self, "units", "sentences") != "sentences":
            raise ValueError("--units claims needs a judge and --metric retrieval_ids has none")
        return self
