"""Each row's outcome, and a scored block as its per-row result table (the chunk file's columns:
``io.schemas.CHUNK_FIELDS``); ``scoring.score_block`` builds both."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from recall_tasks.io.blocks import RowBlock
from recall_tasks.io.schemas import CHUNK_FIELDS, passthrough_name
from recall_tasks.judges.base import Spend
from recall_tasks.metrics.base import Metric
from recall_tasks.models import RecallResult


@dataclass
class RowOutcome:
    """The result of one row, or its error; ``spent``: what the row cost beyond its result's metadata (the
    attempts of a row that got no verdict, its claim extraction when it was not judged)."""

    result: RecallResult | None
    error: str | None
    cached: bool = False
    spent: Spend = field(default_factory=Spend)

    @property
    def requests(self) -> int:
        return self.spent.requests


def results_table(block: RowBlock, outcomes: list[RowOutcome], metric: Metric) -> pa.Table:
    """The per-row result table of a block (result columns, then pass-through columns), without ``run_id``."""
    cols: dict[str, list[Any]] = {f.name: [] for f in CHUNK_FIELDS}
    for i, out in enumerate(outcomes):
        r = out.result
        md = r.metadata if r else None
        cols["row_id"].append(block.row_ids[i])
        cols["content_hash"].append(block.content_hashes[i])
        source, source_row = block.where(i)
        cols["source_file"].append(source)
        cols["source_row"].append(source_row)
        cols["metric"].append(metric.task)
        cols["score"].append(r.score if r else None)
        cols["success"].append(r.success if r else None)
        cols["threshold"].append(metric.threshold)
        cols["reason"].append(r.reason if r else None)
        cols["verdicts"].append(  # the fields of VERDICT_TYPE (model_dump(include=...) was ~40 % of this loop)
            [
                {"statement": v.statement, "verdict": v.verdict, "reason": v.reason, "chunk_ids": v.chunk_ids}
                for v in r.verdicts
            ]
            if r
            else []
        )
        cols["sentence_count"].append(md.sentence_count if md else None)
        cols["attributed_count"].append(md.attributed_count if md else None)
        cols["context_count"].append(md.context_count if md else None)
        cols["context_precision"].append(md.context_precision if md and r and r.score is not None else None)
        cols["chunks_used"].append(md.chunks_used if md and r and r.score is not None else None)
        cols["first_relevant_rank"].append(md.first_relevant_rank if md and r and r.score is not None else None)
        cols["skipped"].append(bool(r and r.skipped))
        cols["error"].append(out.error)
        cols["cached"].append(out.cached)
        cols["judge_model"].append(md.judge_model if md else metric.judge.model)
        cols["prompt_version"].append(md.prompt_version if md else metric.judge.prompt_version)
        # what the row paid: its result's calls (none when cached) plus those that gave it no verdict (``spent``)
        paid = Spend()
        if not out.cached:
            paid = out.spent
            if md is not None:
                paid += Spend(md.requests, md.prompt_tokens, md.completion_tokens, md.cost_usd if md.requests else 0.0)
        cols["prompt_tokens"].append(paid.prompt_tokens)
        cols["completion_tokens"].append(paid.completion_tokens)
        cols["requests"].append(paid.requests)
        cols["cost_usd"].append(paid.cost_usd if paid.requests or out.cached else (md.cost_usd if md else None))
        cols["latency_ms"].append(md.latency_ms if md else None)
        cols["flags"].append(md.flags if md else [])
        cols["reply_model"].append(md.reply_model if md else None)
    table = pa.table(cols, schema=pa.schema(CHUNK_FIELDS))
    for name in block.table.column_names:
        if name not in ("expected_output", "retrieval_context", "actual_output"):
            table = table.append_column(passthrough_name(name), block.table.column(name))
    return table
