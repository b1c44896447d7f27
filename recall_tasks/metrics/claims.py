"""Claims as the units of contextual recall (Mastra's way of counting): extract, check, cache, fall back.

``ContextualRecall(units="claims")`` replaces the code-split sentences by the atomic, self-contained claims an
extractor (``recall_tasks.judges.claims``) finds in the reference answer; the one attribution call then judges
the numbered claims exactly as it judges sentences.

- **One extraction per distinct reference.** :class:`ClaimUnits` looks claims up by :func:`claims_key`
  (extractor model, extraction prompt version, reference text; no expiry) in a :class:`ClaimStore` (the run's
  output cache, see ``io/cache.ClaimCache``), dedupes references within a batch and across the chunks in flight,
  and extracts the misses concurrently. A second run over the same references pays zero extraction calls and
  keeps the same denominator, whatever the index or the retrieved contexts did.
- **Checks** (:func:`claims_problem`): an extraction is unusable when it has no claim, more than
  :data:`MAX_CLAIMS_PER_SENTENCE` x the reference's sentence count, or a claim that is not traceable to the
  reference (:func:`traceable`). An unusable (or unreadable) extraction is retried once with the problem stated;
  unusable again, the row falls back to sentences with a flag. The outcome (claims, or the fallback) is cached
  like claims, so the fallback is frozen too and not paid again.
- **Traceable** (a deliberately simple lexical test): a claim's *content words* are its runs of letters and
  digits, lower-cased, of 3+ characters or containing a digit, minus a short stop list; a word matches when the
  reference has a content word with the same first 5 characters (``developed`` ~ ``develops``; numbers and short
  words must match whole). A claim is traceable when at least :data:`TRACE_SHARE` of its content words match; a
  claim without content words is not. It catches invented facts and claims about another text; it does not catch
  a paraphrase that keeps the words and changes the meaning (the attribution judge sees the claims, not this).
- Extraction costs (requests, tokens, cost) are charged to the first row of the run that has the reference.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from recall_tasks.errors import JudgeConfigError
from recall_tasks.judges.base import Spend, charge
from recall_tasks.judges.claims import ClaimExtractor, ClaimsReply, ClaimsRetry
from recall_tasks.sentences import split_sentences

#: More claims than this many per reference sentence is an unusable extraction.
MAX_CLAIMS_PER_SENTENCE = 3
#: Share of a claim's content words that must be found in the reference.
TRACE_SHARE = 0.5
_STEM = 5
_WORD = re.compile(r"[^\W_]+")
_STOP = frozenset(
    "the and for with from that this these those are was were been being has have had not but its their they them"
    " his her she him who whom whose which what when where how than then there also into onto upon about over"
    " under our your you can could would should will may might must does did any all some such very".split()
)


class NotJudged(Exception):
    """A call was not made: the budget is spent or the circuit breaker tripped (``reason`` says which)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def content_words(text: str) -> list[str]:
    """The words :func:`traceable` compares (see the module docstring)."""
    words = (w.lower() for w in _WORD.findall(text))
    return [w for w in words if (len(w) >= 3 or any(c.isdigit() for c in w)) and w not in _STOP]


def _key(word: str) -> str:
    return word if any(c.isdigit() for c in word) else word[:_STEM]


def traceable(claim: str, reference: str) -> bool:
    """Whether at least :data:`TRACE_SHARE` of the claim's content words occur in the reference."""
    words = content_words(claim)
    if not words:
        return False
    known = {_key(w) for w in content_words(reference)}
    return sum(_key(w) in known for w in words) >= TRACE_SHARE * len(words)


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def claims_problem(claims: Sequence[str], reference: str, sentence_count: int) -> str | None:
    """Why an extraction is unusable (no claims, too many, untraceable), or None when it is usable."""
    if not claims:
        return "no claims"
    limit = MAX_CLAIMS_PER_SENTENCE * max(sentence_count, 1)
    if len(claims) > limit:
        return f"{len(claims)} claims for {sentence_count} sentence(s), more than {MAX_CLAIMS_PER_SENTENCE}x"
    stray = [c for c in claims if not traceable(c, reference)]
    if stray:
        return f"{len(stray)} claim(s) not traceable to the reference, e.g. {json.dumps(_clip(stray[0]))}"
    return None


@dataclass(frozen=True)
class Units:
    """The units of one reference and what getting them cost (zero when they came from the cache)."""

    statements: list[str]
    kind: str  # "claims" or "sentences" (the fallback)
    flags: list[str] = field(default_factory=list)
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None

    def free(self) -> Units:
        """The same units at no cost (a row sharing its reference with an earlier one)."""
        return replace(self, requests=0, prompt_tokens=0, completion_tokens=0, cost_usd=None)

    @property
    def spend(self) -> Spend:
        """What extracting them cost (the row that pays records it, judged or not)."""
        cost = self.cost_usd if self.requests else 0.0
        return Spend(self.requests, self.prompt_tokens, self.completion_tokens, cost)


class ClaimStore(Protocol):
    """Extraction outcomes by :func:`claims_key`: ``{"claims": [...] | None, "flags": [...]}`` (None: fallback)."""

    def get_many(self, keys: list[str]) -> dict[str, dict[str, Any]]: ...

    def put_many(self, entries: Mapping[str, dict[str, Any]], *, flush: bool = True) -> bool: ...


class MemoryClaimStore:
    """A :class:`ClaimStore` for one process (library use, ``--no-cache`` runs)."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}

    def get_many(self, keys: list[str]) -> dict[str, dict[str, Any]]:
        return {k: self.entries[k] for k in keys if k in self.entries}

    def put_many(self, entries: Mapping[str, dict[str, Any]], *, flush: bool = True) -> bool:
        self.entries.update(entries)
        return False


def claims_key(extractor: ClaimExtractor, reference: str) -> str:
    """Content address of a reference's claims: extractor model, extraction prompt version, reference text."""
    payload = json.dumps(["claims", extractor.model, extractor.claims_prompt_version, reference], ensure_ascii=False)
    return hashlib.blake2b(payload.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


#: Runs one extraction call under the run's budget and circuit breaker (raises :class:`NotJudged`).
Guard = Callable[[Callable[[], Awaitable[ClaimsReply]]], Awaitable[ClaimsReply]]


async def _unguarded(call: Callable[[], Awaitable[ClaimsReply]]) -> ClaimsReply:
    return await call()


def units_from_stored(value: dict[str, Any], reference: str) -> Units:
    claims = value.get("claims")
    flags = list(value.get("flags") or [])
    if claims:
        return Units(statements=list(claims), kind="claims", flags=flags)
    return Units(statements=split_sentences(reference), kind="sentences", flags=flags)


class ClaimUnits:
    """Claims per distinct reference: cached, deduplicated, extracted concurrently, checked, with the fallback."""

    def __init__(self, extractor: ClaimExtractor, store: ClaimStore | None = None) -> None:
        self.extractor = extractor
        self.store: ClaimStore = store if store is not None else MemoryClaimStore()
        self._in_flight: dict[str, asyncio.Task[Units]] = {}
        self.extractions = 0  # references this instance extracted (not served by the store)

    async def units_for(
        self, references: Sequence[str], guard: Guard | None = None
    ) -> dict[str, Units | BaseException]:
        """Units of each distinct reference; a reference whose extraction failed maps to its exception.

        A :class:`~recall_tasks.errors.JudgeConfigError` is raised (it stops the run). Each reference's cost is
        reported once per process: later batches (and other chunks waiting on the same extraction) get it free.
        """
        guard = guard or _unguarded
        keys = {ref: claims_key(self.extractor, ref) for ref in dict.fromkeys(references)}
        out: dict[str, Units | BaseException] = {}
        waiting = {ref: self._in_flight[k] for ref, k in keys.items() if k in self._in_flight}
        lookup = [k for ref, k in keys.items() if ref not in waiting]
        stored = await asyncio.to_thread(self.store.get_many, lookup) if lookup else {}
        mine: dict[str, asyncio.Task[Units]] = {}
        for ref, k in keys.items():
            if ref in waiting:
                continue
            if k in stored:
                out[ref] = units_from_stored(stored[k], ref)
            elif k in self._in_flight:  # started by another chunk while we read the store
                waiting[ref] = self._in_flight[k]
            else:
                task = asyncio.ensure_future(self._extract(ref, k, guard))
                self._in_flight[k] = mine[ref] = task
        try:
            for ref, task in {**mine, **waiting}.items():
                try:
                    units = await asyncio.shield(task) if ref in waiting else await task
                except JudgeConfigError:
                    raise
                except asyncio.CancelledError:
                    if ref in waiting and task.cancelled() and not _current_cancelling():
                        out[ref] = NotJudged("the extraction it waited for was cancelled")
                        continue
                    raise
                except Exception as exc:  # noqa: BLE001 - a row error (transient failure, not judged)
                    out[ref] = exc
                    continue
                out[ref] = units.free() if ref in waiting else units
        finally:
            for ref, task in mine.items():
                if not task.done():
                    task.cancel()
                if self._in_flight.get(keys[ref]) is task:
                    del self._in_flight[keys[ref]]
        return out

    async def _extract(self, reference: str, key: str, guard: Guard) -> Units:
        sentences = split_sentences(reference)
        limit = MAX_CLAIMS_PER_SENTENCE * max(len(sentences), 1)
        replies = [await guard(lambda: self.extractor.extract_claims(reference))]
        first = replies[0].problem or claims_problem(replies[0].claims, reference, len(sentences))
        problem = first
        if first is not None:
            retry = ClaimsRetry(previous=replies[0].raw, problem=first, limit=limit)
            try:
                replies.append(await guard(lambda: self.extractor.extract_claims(reference, retry)))
            except BaseException as exc:  # the retry failed or was not made: the first extraction was paid
                charge(exc, _spend(replies))
                raise
            problem = replies[1].problem or claims_problem(replies[1].claims, reference, len(sentences))
        if problem is None:
            claims: list[str] | None = replies[-1].claims
            flags = [] if first is None else [f"claims extracted on the retry (first extraction: {first})"]
        else:
            claims = None
            flags = [f"claims unusable after one retry ({problem}): scored on sentences"]
        value = {"claims": claims, "flags": flags}
        await asyncio.to_thread(self.store.put_many, {key: value}, flush=False)
        self.extractions += 1
        units = units_from_stored(value, reference)
        spent = _spend(replies)
        return replace(
            units,
            requests=spent.requests,
            prompt_tokens=spent.prompt_tokens,
            completion_tokens=spent.completion_tokens,
            cost_usd=spent.cost_usd,
        )


def _spend(replies: Sequence[ClaimsReply]) -> Spend:
    total = Spend()
    for r in replies:
        total += Spend(r.requests, r.prompt_tokens, r.completion_tokens, r.cost_usd)
    return total


def _current_cancelling() -> bool:
    task = asyncio.current_task()
    return bool(task is not None and task.cancelling())


@runtime_checkable
class ClaimsMetric(Protocol):
    """A metric whose units may be claims (contextual recall): ``claim_units`` is None for code-split sentences.
    The pipeline reads it through :func:`claim_units_of` (fingerprints, ``--dry-run``, fleet limits, guards)."""

    claim_units: ClaimUnits | None


def claim_units_of(metric: object) -> ClaimUnits | None:
    """The claims of ``metric``'s units (None: sentences, or a metric without claims)."""
    return metric.claim_units if isinstance(metric, ClaimsMetric) else None
