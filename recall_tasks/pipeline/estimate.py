"""``run --dry-run``: the bill before paying. Reads the dataset and the row cache, calls no judge, writes nothing.

The rows a run would send to the judge are the row cache's misses (a duplicate row counts as a live run sends it:
once per row, unless an earlier chunk cached it; the batch price is then an upper bound).
Per request: its prompt tokens estimated as the body's message characters / 4 (what ``--tpm`` charges too), its
completion tokens as :data:`COMPLETION_BASE` plus :data:`COMPLETION_PER_STATEMENT` per statement (half that
without reasons); cost at the model's price (``judges/pricing.py``, ``--price``), live and at the Batch API's
discount. Then which of ``--max-requests``, ``--max-cost-usd``, ``--tpm``, ``--rpm`` would stop or pace the run.
No pre-flight request either: the endpoint is not contacted. Claim extraction (``--units claims``) is not
estimated; ``--retriever`` is refused (it would call the retriever).
"""

from __future__ import annotations

from dataclasses import dataclass

from recall_tasks._sync import run_sync
from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError
from recall_tasks.io.blocks import iter_blocks
from recall_tasks.io.cache import RowVerdictCache
from recall_tasks.io.retrieval import with_contexts
from recall_tasks.io.storage import filesystem, join_uri
from recall_tasks.judges.base import JudgeRequest
from recall_tasks.judges.pricing import BATCH_PRICE_FACTOR, price_for
from recall_tasks.pipeline.scoring import keyed_requests, metric_fingerprint

#: Completion tokens of a verdict answer: a fixed part, and per statement (verdict, chunk ids, a short reason).
COMPLETION_BASE = 8
COMPLETION_PER_STATEMENT = 20


@dataclass
class Estimate:
    rows: int  # rows in the dataset
    cached: int  # rows the row cache serves
    requests: int  # judge requests the run would send (the rows the row cache cannot serve)
    prompt_tokens: int
    completion_tokens: int
    charged_tokens: int  # what --tpm charges: prompt estimate plus each request's completion budget
    model: str
    price: tuple[float, float] | None  # USD per million tokens (input, output); None: unknown model

    def cost(self, factor: float = 1.0) -> float | None:
        if self.price is None:
            return None
        return factor * (self.prompt_tokens * self.price[0] + self.completion_tokens * self.price[1]) / 1e6


def estimate(params: RunParams) -> Estimate:
    """What ``params`` would send to the judge, from the dataset and the row cache alone."""
    if params.retriever:
        raise ConfigError("--dry-run cannot estimate a run with --retriever: it would call the retriever")
    from recall_tasks.pipeline.steps import check_run

    # the run's own checks (one function: a dry run refuses what the run refuses), without the endpoint's probes
    checked = check_run(params, contact=False)
    storage, dataset, trace, retrieval = checked.storage, checked.dataset, checked.trace, checked.retrieval
    metric = checked.metric
    judge = metric.judge
    cache = None
    cache_uri = params.cache_uri or join_uri(params.output_uri, "cache")
    if params.cache and not params.refresh_cache:
        fs, root = filesystem(cache_uri, storage)
        if fs.exists(root):  # opening a cache creates its folder: a dry run writes nothing
            cache = RowVerdictCache(cache_uri, storage, read=True)
    fingerprint = metric_fingerprint(metric)

    requests: list[JudgeRequest] = []
    cached = 0
    columns = ["input", "expected_output", "retrieval_context", "actual_output"]
    for block in iter_blocks(dataset, params.chunk_size):
        if trace is not None:
            block = trace.apply(block)
        elif retrieval is not None:
            block = with_contexts(block, retrieval.contexts_for(block.row_ids))
        pairs = run_sync(keyed_requests(metric, fingerprint, block.table.select(columns).to_pylist()))
        hits = cache.get_many([k for k, _ in pairs]) if cache is not None else {}
        cached += sum(1 for k, _ in pairs if k in hits)
        requests += [r for k, r in pairs if k not in hits]
    prompt = completion = charged = 0
    body_of = getattr(judge, "batch_body", None)  # the lexical judge sends nothing and costs nothing
    for request in requests:
        if body_of is None:
            break
        body = body_of(request)
        chars = sum(len(m.get("content") or "") for m in body["messages"])
        per = COMPLETION_PER_STATEMENT if request.include_reason else COMPLETION_PER_STATEMENT // 2
        prompt += chars // 4
        completion += COMPLETION_BASE + per * len(request.statements)
        charged += chars // 4 + int(next(v for k, v in body.items() if k.startswith("max_")))
    model = getattr(judge, "model", params.model) if body_of is not None else "lexical"
    price = price_for(model, {**getattr(judge, "prices", {})}) if body_of is not None else (0.0, 0.0)
    return Estimate(dataset.num_rows, cached, len(requests) if body_of is not None else 0, prompt, completion,
                    charged, model, price)  # fmt: skip


def report(params: RunParams, est: Estimate) -> list[str]:
    """The dry-run's lines: what would be judged, its tokens and cost, and the limits that would stop it."""

    def usd(value: float | None) -> str:
        return "unknown (no price for this model: --price MODEL=IN,OUT)" if value is None else f"${value:.4f}"

    lines = [
        f"dry run: {est.rows} rows, {est.cached} served by the row cache, {est.requests} judge requests "
        f"(one per row); nothing judged, nothing written",
        f"model {est.model}: ~{est.prompt_tokens:,} prompt + ~{est.completion_tokens:,} completion tokens",
        f"cost: ~{usd(est.cost())} live, ~{usd(est.cost(BATCH_PRICE_FACTOR))} at the batch price",
    ]
    stops = []
    if params.max_requests is not None and est.requests > params.max_requests:
        stops.append(f"--max-requests {params.max_requests} stops after ~{params.max_requests} rows")
    live = est.cost()
    if params.max_cost_usd is not None and live is not None and live > params.max_cost_usd and est.requests:
        per_row = live / est.requests
        stops.append(f"--max-cost-usd {params.max_cost_usd:g} stops after ~{int(params.max_cost_usd / per_row)} rows")
    paced = []
    if params.tokens_per_minute and est.requests:
        paced.append(
            f"--tpm {params.tokens_per_minute:g}: ~{est.charged_tokens / params.tokens_per_minute:.1f} minutes"
        )
    if params.requests_per_minute and est.requests:
        paced.append(f"--rpm {params.requests_per_minute:g}: ~{est.requests / params.requests_per_minute:.1f} minutes")
    lines.append("limits: " + ("; ".join(stops) if stops else "none would stop the run"))
    if paced:
        lines.append("pace: " + "; ".join(paced))
    return lines
