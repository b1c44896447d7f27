"""``run --dry-run``: the bill before paying. Reads the dataset and the row cache, calls no judge, writes nothing.

The requests a run would send to the judge are the row cache's misses, one per distinct row-cache key: rows with the
same key (same question, reference, contexts and judge settings) share one request in a run, as they do here.
Per request: its prompt tokens at most, the one estimate of its body (messages and schema, never below the
tokenizer's count: :func:`~recall_tasks.judges.tokens.request_tokens`, which ``--tpm``, the cost cap and
``--batch`` take too), its completion tokens as :data:`COMPLETION_BASE` plus :data:`COMPLETION_PER_STATEMENT` per
statement (half that without reasons); cost at the model's price (``judges/pricing.py``, ``--price``), live and at
the Batch API's discount. Then which of ``--max-requests``, ``--max-cost-usd``, ``--tpm``, ``--rpm`` would stop or
pace the run. No pre-flight request either: the endpoint is not contacted. Claim extraction (``--units claims``):
one request per distinct reference whose claims the claims cache does not hold (rows with no context or no sentence
pay none, as in the run), its reply estimated as long as the reference; a row whose claims are cached is priced on
them, the others on their sentences; a retried extraction (an unusable first reply) is not foreseen.
``--retriever`` is refused (it would call the retriever). The checks are the run's own (``steps.check_run``
without the endpoint's probes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from recall_tasks._sync import run_sync
from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError
from recall_tasks.io.blocks import iter_blocks
from recall_tasks.io.cache import ClaimCache, RowVerdictCache
from recall_tasks.io.columns import JUDGED_ROLES
from recall_tasks.io.storage import filesystem, join_uri
from recall_tasks.judges import tokens
from recall_tasks.judges.base import JudgeRequest
from recall_tasks.judges.capabilities import Batching, prices_of
from recall_tasks.judges.pricing import BATCH_PRICE_FACTOR, price_for
from recall_tasks.judges.prompts import CLAIMS_SCHEMA, claims_messages
from recall_tasks.metrics.claims import Units, claim_units_of, claims_key, units_from_stored
from recall_tasks.metrics.recall import has_context
from recall_tasks.pipeline.scoring import keyed_requests, metric_fingerprint
from recall_tasks.sentences import split_sentences

#: Completion tokens of a verdict answer: a fixed part, and per statement (verdict, chunk ids, a short reason).
COMPLETION_BASE = 8
COMPLETION_PER_STATEMENT = 20


@dataclass
class Extractions:
    """The claim extractions of ``--units claims``: one per distinct reference the claims cache does not hold."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    charged_tokens: int = 0
    model: str = ""
    price: tuple[float, float] | None = (0.0, 0.0)

    def cost(self) -> float | None:
        if not self.requests:
            return 0.0
        if self.price is None:
            return None
        return (self.prompt_tokens * self.price[0] + self.completion_tokens * self.price[1]) / 1e6


@dataclass
class Estimate:
    rows: int  # rows in the dataset
    cached: int  # rows the row cache serves
    requests: int  # judge requests the run would send (the distinct rows the row cache cannot serve)
    prompt_tokens: int
    completion_tokens: int
    charged_tokens: int  # what --tpm charges: prompt estimate plus each request's completion budget
    model: str
    price: tuple[float, float] | None  # USD per million tokens (input, output); None: unknown model
    extractions: Extractions = field(default_factory=Extractions)
    canary_rows: int = 0  # --canary: its labelled rows, judged at the end of the run (pipeline/canary.py)

    def cost(self, factor: float = 1.0) -> float | None:
        """Judge requests at ``factor`` of the live price (the batch discount), claim extractions live (never
        batched); None when a model has no price."""
        extraction = self.extractions.cost()
        if self.price is None or extraction is None:
            return None
        judged = factor * (self.prompt_tokens * self.price[0] + self.completion_tokens * self.price[1]) / 1e6
        return judged + extraction

    @property
    def all_requests(self) -> int:
        return self.requests + self.extractions.requests


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

    claim_units = claim_units_of(metric)
    claims_cache = None
    if claim_units is not None and cache is not None:
        claims_uri = f"{cache_uri.rstrip('/')}/{RowVerdictCache.SUBSTORE}"
        fs, root = filesystem(claims_uri, storage)
        claims_cache = ClaimCache(claims_uri, storage, read=True) if fs.exists(root) else None
    to_extract: dict[str, None] = {}  # distinct references without cached claims, in order

    requests: dict[str, JudgeRequest] = {}  # the misses by row-cache key: identical rows share one request
    cached = 0
    columns = list(JUDGED_ROLES)
    for block in iter_blocks(dataset, params.chunk_size):
        if trace is not None:
            block = trace.apply(block)
        elif retrieval is not None:
            block = retrieval.apply(block)
        rows = block.table.select(columns).to_pylist()
        units = _claims_of(claim_units, claims_cache, rows, to_extract) if claim_units is not None else None
        pairs = run_sync(keyed_requests(metric, fingerprint, rows, units))
        hits = cache.get_many([k for k, _ in pairs]) if cache is not None else {}
        cached += sum(1 for k, _ in pairs if k in hits)
        requests.update((k, r) for k, r in pairs if k not in hits)
    prompt = completion = charged = 0
    # the lexical judge sends nothing and costs nothing
    body_of = judge.batch_body if isinstance(judge, Batching) else None
    for request in requests.values():
        if body_of is None:
            break
        asked, limit = tokens.request_tokens(body_of(request))
        per = COMPLETION_PER_STATEMENT if request.include_reason else COMPLETION_PER_STATEMENT // 2
        prompt += asked
        completion += COMPLETION_BASE + per * len(request.statements)
        charged += asked + limit
    model = judge.model if body_of is not None else "lexical"
    price = price_for(model, {**prices_of(judge)}) if body_of is not None else (0.0, 0.0)
    extractions = _extractions(claim_units.extractor, list(to_extract)) if claim_units is not None else Extractions()
    return Estimate(dataset.num_rows, cached, len(requests) if body_of is not None else 0, prompt, completion,
                    charged, model, price, extractions,
                    len(checked.canary.rows) if checked.canary is not None else 0)  # fmt: skip


def _claims_of(
    claim_units: Any, store: ClaimCache | None, rows: list[dict[str, Any]], to_extract: dict[str, None]
) -> list[Units | None]:
    """Each row's claims when the claims cache holds them (their judge request is then the run's, and its row-cache
    key too); a row without, whose reference will be extracted (it has a context and a sentence), adds its
    reference to ``to_extract`` and is priced on its sentences."""
    refs = [row.get("expected_output") or None for row in rows]
    keys = {ref: claims_key(claim_units.extractor, ref) for ref in refs if ref}
    stored = store.get_many(list(dict.fromkeys(keys.values()))) if store is not None and keys else {}
    out: list[Units | None] = []
    for row, ref in zip(rows, refs, strict=True):
        key = keys.get(ref) if ref else None
        if ref and key in stored:
            out.append(units_from_stored(stored[key], ref))
            continue
        if ref and has_context(row.get("retrieval_context")) and split_sentences(ref):
            to_extract.setdefault(ref)
        out.append(None)
    return out


def _extractions(extractor: Any, references: list[str]) -> Extractions:
    """One extraction request per reference: its prompt tokens at most (messages and schema, the one estimate), a
    reply about as long as the reference (its claims restate it, as JSON), the request's completion budget for
    ``--tpm``."""
    out = Extractions(requests=len(references), model=extractor.model)
    for ref in references:
        asked = tokens.prompt_tokens(claims_messages(ref), CLAIMS_SCHEMA)
        reply = tokens.count(json.dumps({"claims": split_sentences(ref)}, ensure_ascii=False))
        out.prompt_tokens += asked
        out.completion_tokens += COMPLETION_BASE + reply
        out.charged_tokens += asked + 128 + len(ref) // 2  # the budget extract_claims asks for
    out.price = price_for(extractor.model, {**prices_of(extractor)}) if references else (0.0, 0.0)
    return out


def report(params: RunParams, est: Estimate) -> list[str]:
    """The dry-run's lines: what would be judged, its tokens and cost, and the limits that would stop it."""

    def usd(value: float | None) -> str:
        return "unknown (no price for this model: --price MODEL=IN,OUT)" if value is None else f"${value:.4f}"

    ex = est.extractions
    lines = [
        f"dry run: {est.rows} rows, {est.cached} served by the row cache, {est.requests} judge requests "
        f"(one per distinct row); nothing judged, nothing written",
        f"model {est.model}: ~{est.prompt_tokens:,} prompt + ~{est.completion_tokens:,} completion tokens",
    ]
    if params.units == "claims":
        lines.append(
            f"claim extraction: {ex.requests} requests (one per distinct reference the claims cache does not hold), "
            f"model {ex.model or params.extractor_model or params.model}: ~{ex.prompt_tokens:,} prompt + "
            f"~{ex.completion_tokens:,} completion tokens, ~{usd(ex.cost())}; rows whose claims are not cached are "
            f"priced on their sentences; a retried extraction is not counted"
        )
    lines.append(f"cost: ~{usd(est.cost())} live, ~{usd(est.cost(BATCH_PRICE_FACTOR))} at the batch price")
    if params.canary:
        when = (
            f"re-judged, as the run judges rows afresh: {est.canary_rows} more requests"
            if est.requests or ex.requests
            else "served by the row cache when it holds them (the run judges nothing afresh)"
        )
        lines.append(f"canary: {est.canary_rows} labelled rows judged at the end of the run, {when}; not in the "
                     "figures above")  # fmt: skip
    total = est.all_requests
    stops = []
    if params.max_requests is not None and total > params.max_requests:
        what = f"{params.max_requests} of {total} requests" if ex.requests else f"{params.max_requests} rows"
        stops.append(f"--max-requests {params.max_requests} stops after ~{what}")
    live = est.cost()
    if params.max_cost_usd is not None and live is not None and live > params.max_cost_usd and est.requests:
        per_row = live / est.requests
        stops.append(f"--max-cost-usd {params.max_cost_usd:g} stops after ~{int(params.max_cost_usd / per_row)} rows")
    paced = []
    if params.tokens_per_minute and total:
        charged = est.charged_tokens + ex.charged_tokens
        paced.append(f"--tpm {params.tokens_per_minute:g}: ~{charged / params.tokens_per_minute:.1f} minutes")
    if params.requests_per_minute and total:
        paced.append(f"--rpm {params.requests_per_minute:g}: ~{total / params.requests_per_minute:.1f} minutes")
    lines.append("limits: " + ("; ".join(stops) if stops else "none would stop the run"))
    lines.extend(_caps(params, est))
    if paced:
        lines.append("pace: " + "; ".join(paced))
    return lines


def _caps(params: RunParams, est: Estimate) -> list[str]:
    """How ``--max-requests`` / ``--max-cost-usd`` hold (docs/usage.md, "Spending caps")."""
    held = []
    if params.max_requests is not None:
        held.append(f"--max-requests {params.max_requests} counts every attempt (retries, repairs) before it is sent")
    if params.max_cost_usd is not None:
        text = f"--max-cost-usd {params.max_cost_usd:g} reserves each attempt's worst case before it is sent"
        if est.price is not None and est.requests:
            # what each attempt reserves: its prompt tokens at most and its completion limit, at the price
            limit = est.charged_tokens - est.prompt_tokens
            worst = (est.prompt_tokens * est.price[0] + limit * est.price[1]) / 1e6 / est.requests
            text += f" (about ${worst:.6f} a request, against ~${(est.cost() or 0.0) / est.requests:.6f} spent)"
        held.append(text + " and gets back what the reply did not use")
    if not held:
        return []
    return ["caps: " + "; ".join(held) + "; never exceeded, and counted for the run across a resume"]
