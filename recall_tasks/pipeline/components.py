"""What a run is made of, built from its parameters: the judge, the claim extractor, the metric; their limits.

Used by the flow's plan (:func:`~recall_tasks.pipeline.steps.plan_run`), each worker process's plan
(:mod:`~recall_tasks.pipeline.workers`) and the batch collection (:mod:`~recall_tasks.pipeline.batch.record`).
"""

from __future__ import annotations

from typing import Any

from recall_tasks._sync import run_sync
from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError
from recall_tasks.io.columns import parse_column_overrides
from recall_tasks.io.datasets import Dataset, open_dataset
from recall_tasks.io.storage import StorageConfig
from recall_tasks.judges.base import Judge
from recall_tasks.judges.capabilities import Closable
from recall_tasks.metrics import ContextCoverage, ContextualRecall
from recall_tasks.metrics.base import Metric


def make_judge(params: RunParams) -> Judge:
    """The judge a run asks for; keys come from the environment, never from parameters."""
    if params.metric == "retrieval_ids":  # no judge: one that is never asked (metrics/retrieval_ids.py)
        from recall_tasks.metrics.retrieval_ids import NoJudge

        return NoJudge({"k": params.k, "id_pattern": params.id_pattern, "verdict_metric": params.verdict_metric})
    if params.judge == "lexical":
        from recall_tasks.judges.lexical import LexicalJudge

        return LexicalJudge()
    from recall_tasks.judges.openai_judge import OpenAIJudge

    return OpenAIJudge(
        model=params.model,
        base_url=params.base_url,
        max_concurrency=params.max_concurrency,
        timeout_s=params.timeout_s,
        max_retries=params.max_retries,
        requests_per_minute=params.requests_per_minute,
        tokens_per_minute=params.tokens_per_minute,
        prices=params.prices or None,
        context_window_tokens=params.context_window,
        on_overlong=params.on_overlong,
    )


def make_extractor(params: RunParams, judge: Judge) -> Any:
    """The claim extractor of ``--units claims``: the judge itself, or an OpenAI judge on ``--extractor-model``."""
    if not params.extractor_model or params.extractor_model == judge.model:
        return judge
    from recall_tasks.judges.openai_judge import OpenAIJudge

    return OpenAIJudge(
        model=params.extractor_model, base_url=params.base_url, max_concurrency=params.max_concurrency,
        timeout_s=params.timeout_s, max_retries=params.max_retries,
        requests_per_minute=params.requests_per_minute, tokens_per_minute=params.tokens_per_minute,
        prices=params.prices or None,
    )  # fmt: skip


def make_metric(params: RunParams, judge: Judge) -> Metric:
    common: dict[str, Any] = {
        "judge": judge, "threshold": params.threshold, "scale": params.scale,
        "include_reason": params.include_reason, "strict_mode": params.strict_mode, "on_missing": params.on_missing,
    }  # fmt: skip
    if params.metric == "retrieval_ids":
        from recall_tasks.metrics.retrieval_ids import RetrievalIds

        return RetrievalIds(**common)
    if params.metric != "contextual_recall":
        return ContextCoverage(**common)
    if params.units == "claims":
        return ContextualRecall(**common, units="claims", claim_extractor=make_extractor(params, judge))
    return ContextualRecall(**common)


def share_limits(params: RunParams, metric: Metric) -> None:
    """``--rpm``/``--tpm`` for the whole fleet (:mod:`~recall_tasks.fleet.rate`), before any judge call."""
    if params.requests_per_minute or params.tokens_per_minute:
        from recall_tasks.fleet import rate as fleet

        fleet.share_run_limits(params, metric)


def check_units(params: RunParams) -> None:
    """``--units claims`` needs contextual recall and an LLM extractor; refused before any call (ConfigError)."""
    if params.units == "sentences":
        if params.extractor_model:
            raise ConfigError("--extractor-model applies to --units claims only")
        return
    if params.metric != "contextual_recall":
        raise ConfigError(
            "--units claims applies to contextual_recall only: context coverage decides the retrieved context "
            "items, which are not split into units"
        )
    if params.judge == "lexical":
        raise ConfigError(
            "--units claims needs an LLM to extract the claims and the lexical judge has none: use --judge openai "
            "(optionally --extractor-model M), or --units sentences"
        )


def release_judge(judge: Judge) -> None:
    """Close a judge's HTTP client (it lives on the shared background loop)."""
    if isinstance(judge, Closable):
        run_sync(judge.aclose())


def open_run_dataset(params: RunParams, storage: StorageConfig, contexts_supplied: bool) -> Dataset:
    """The run's dataset as ``params`` describe it (column overrides, traces); ``contexts_supplied``: the
    contexts come from elsewhere (a retrieval file or a retriever), so the column may be missing."""
    traces = bool(params.context_from or params.context_extractor)
    overrides = parse_column_overrides(params.columns)
    return open_dataset(params.dataset_uri, storage, params.metric, overrides, contexts_supplied, traces=traces)
