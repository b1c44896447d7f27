"""The lexical judge itself: ``LexicalJudge``, its per-request state (IDF weights, evidence bitmasks), the
two decisions (contextual recall, context coverage) and their reasons; thresholds, weighting and
``PROMPT_VERSION``. The algorithm and its limits are described in the package docstring.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Final

from recall_tasks.judges.base import JudgeRequest, JudgeResponse, JudgeVerdict
from recall_tasks.judges.lexical.analysis import _Analysis, _analyze
from recall_tasks.judges.lexical.lexicon import _GENERIC_WORDS
from recall_tasks.judges.lexical.stemmer import stem
from recall_tasks.judges.lexical.tokens import _is_cjk

PROMPT_VERSION: Final = "lexical-v3"
MODEL_NAME: Final = "lexical"

DEFAULT_SUPPORT_THRESHOLD: Final = 0.67
DEFAULT_COVERAGE_THRESHOLD: Final = 0.4

# Weighting (part of the algorithm: changing any of them needs a PROMPT_VERSION bump).
_IDF_STRENGTH: Final = 0.5  # weight = 1 + strength * ln((N + 1) / (df + 1)), df excluding the own text
_NUMBER_WEIGHT: Final = 2.0
_PROPER_WEIGHT: Final = 1.5
_GENERIC_WEIGHT: Final = 0.4
_CJK_UNIGRAM_WEIGHT: Final = 0.5
_QUESTION_WEIGHT: Final = 0.75  # terms the question already names may be left implicit by the evidence
# Context coverage, second path (long items): one answer sentence mostly made of the item's terms.
_SENTENCE_SHARE: Final = 0.6
_SENTENCE_MIN_TERMS: Final = 3

_GENERIC: Final = frozenset(stem(w) for w in _GENERIC_WORDS)


class _Request:
    """Per-request state: analyses, IDF weights, evidence match sets and per-term evidence bitmasks."""

    def __init__(self, request: JudgeRequest) -> None:
        self.statements = [_analyze(s) for s in request.statements]
        self.evidence = [_analyze(e) for e in request.evidence]
        docs = self.statements + self.evidence
        self.n_docs = len(docs)
        acronyms: dict[str, frozenset[str]] = {}
        for d in docs:
            for acr, exp in d.acronyms:
                acronyms[acr] = acronyms.get(acr, frozenset()) | exp
        self.match: list[frozenset[str]] = []
        for e in self.evidence:
            m = e.match
            if acronyms:
                extra: set[str] = set()
                for acr, exp in acronyms.items():
                    if acr in m:
                        extra |= exp
                    elif exp <= m:
                        extra.add(acr)
                if extra:
                    m = m | extra
            self.match.append(m)
        self.df: Counter[str] = Counter()
        for d in docs:
            self.df.update(d.match)
        self.proper: set[str] = set()
        for d in docs:
            self.proper |= d.proper
        self.question = frozenset(_analyze(request.question).terms) if request.question else frozenset()
        self._weights: dict[str, float] = {}
        self._masks: dict[str, int] = {}

    def weight(self, term: str) -> float:
        w = self._weights.get(term)
        if w is not None:
            return w
        df_other = max(self.df.get(term, 1) - 1, 1)  # documents other than the statement itself
        w = 1.0 + _IDF_STRENGTH * math.log((self.n_docs + 1) / (df_other + 1))
        if term[0] == "#":
            w *= _NUMBER_WEIGHT
        elif term in self.proper:
            w *= _PROPER_WEIGHT
        elif term in _GENERIC:
            w *= _GENERIC_WEIGHT
        elif len(term) == 1 and _is_cjk(term):
            w *= _CJK_UNIGRAM_WEIGHT
        if term in self.question:
            w *= _QUESTION_WEIGHT
        self._weights[term] = w
        return w

    def mask(self, term: str) -> int:
        """Bit ``i`` set when evidence ``i`` contains ``term``."""
        mask = self._masks.get(term)
        if mask is None:
            mask = 0
            for idx, m in enumerate(self.match):
                if term in m:
                    mask |= 1 << idx
            self._masks[term] = mask
        return mask


def _missing_reason(prefix: str, analysis: _Analysis, missing: list[tuple[float, str]]) -> str:
    missing.sort(key=lambda x: -x[0])
    names = ", ".join(f"'{analysis.surface.get(t, t)}'" for _w, t in missing[:4])
    more = f" (+{len(missing) - 4} more)" if len(missing) > 4 else ""
    return f"{prefix}: missing {names}{more}" if names else f"{prefix}: no key terms in common"


def _bits(mask: int) -> tuple[int, ...]:
    """0-based indexes of the bits set in ``mask``."""
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


def _chunks_label(ids: tuple[int, ...]) -> str:
    return f"chunk {ids[0] + 1}" if len(ids) == 1 else f"chunks {ids[0] + 1}+{ids[1] + 1}"


class LexicalJudge:
    """Offline, deterministic judge by weighted key-term overlap (see the package docstring for its limits)."""

    def __init__(
        self,
        support_threshold: float = DEFAULT_SUPPORT_THRESHOLD,
        coverage_threshold: float = DEFAULT_COVERAGE_THRESHOLD,
    ) -> None:
        for name, value in (
            ("support_threshold", support_threshold),
            ("coverage_threshold", coverage_threshold),
        ):
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        self.support_threshold = float(support_threshold)
        self.coverage_threshold = float(coverage_threshold)

    @property
    def model(self) -> str:
        return MODEL_NAME

    @property
    def prompt_version(self) -> str:
        return PROMPT_VERSION

    def config(self) -> dict[str, Any]:
        return {
            "judge": MODEL_NAME,
            "version": PROMPT_VERSION,
            "support_threshold": self.support_threshold,
            "coverage_threshold": self.coverage_threshold,
        }

    async def judge(self, request: JudgeRequest) -> JudgeResponse:
        return self.judge_sync(request)

    def judge_sync(self, request: JudgeRequest) -> JudgeResponse:
        """Decide every statement of ``request``; pure CPU, deterministic."""
        with_reason = request.include_reason
        if not request.statements:
            verdicts: list[JudgeVerdict] = []
        elif not any(e.strip() for e in request.evidence):
            reason = "no evidence" if with_reason else ""
            count = len(request.statements)
            verdicts = [JudgeVerdict(id=k, verdict="no", reason=reason) for k in range(1, count + 1)]
        else:
            ctx = _Request(request)
            decide = self._recall if request.task == "contextual_recall" else self._coverage
            verdicts = [decide(ctx, k, with_reason) for k in range(len(request.statements))]
        yes = sum(v.verdict == "yes" for v in verdicts)
        word = "supported" if request.task == "contextual_recall" else "used"
        return JudgeResponse(
            verdicts=verdicts,
            summary=f"lexical: {yes}/{len(verdicts)} {word}",
            model=MODEL_NAME,
            prompt_version=PROMPT_VERSION,
            prompt_tokens=0,
            completion_tokens=0,
            cost_usd=0.0,
            requests=0,
        )

    # -- contextual recall: statement = expected-output sentence, evidence = context chunks ------------

    def _recall(self, ctx: _Request, k: int, with_reason: bool) -> JudgeVerdict:
        st = ctx.statements[k]
        terms = st.terms
        if not terms:
            return JudgeVerdict(id=k + 1, verdict="no", reason="no key terms to check" if with_reason else "")
        weights = [ctx.weight(t) for t in terms]
        masks = [ctx.mask(t) for t in terms]
        total = sum(weights)
        n_ev = len(ctx.match)
        single = [0.0] * n_ev
        both = [0.0] * n_ev  # weight of terms found in evidence idx and idx + 1
        for w, mask in zip(weights, masks, strict=True):
            m = mask
            while m:
                low = m & -m
                single[low.bit_length() - 1] += w
                m ^= low
            m = mask & (mask >> 1)
            while m:
                low = m & -m
                both[low.bit_length() - 1] += w
                m ^= low
        # candidates (coverage, first index, bitmask of chunks): single chunks first, then adjacent pairs
        # whose union covers more than either chunk alone
        singles = sorted((-single[i] / total, i, 1 << i) for i in range(n_ev) if single[i] > 0)
        pairs = []
        for i in range(n_ev - 1):
            a, b = single[i], single[i + 1]
            union = a + b - both[i]
            if a > 0 and b > 0 and union > max(a, b) + 1e-12:
                pairs.append((-union / total, i, 3 << i))
        pairs.sort()
        numeric = [(t, w, m) for t, w, m in zip(terms, weights, masks, strict=True) if t[0] == "#"]
        threshold = self.support_threshold
        failure: tuple[int, str] | None = None  # best candidate failing a check: (bitmask, check)
        for neg_cov, _i, cmask in singles + pairs:
            coverage = -neg_cov
            if coverage >= threshold:
                problem = self._gate(ctx, st, cmask, terms, weights, masks)
                if problem is None:
                    ids = _bits(cmask)
                    reason = ""
                    if with_reason:
                        reason = f"supported by {_chunks_label(ids)} ({coverage:.0%} of key terms)"
                    chunk_ids = [i + 1 for i in ids]
                    return JudgeVerdict(id=k + 1, verdict="yes", reason=reason, chunk_ids=chunk_ids)
                if failure is None:
                    failure = (cmask, problem)
            elif failure is None and st.numbers:
                # below the threshold only because its numbers differ: report a number mismatch
                lost = sum(w for t, w, m in numeric if not m & cmask)
                if lost and coverage + lost / total >= threshold:
                    failure = (cmask, "number")
        if not with_reason:
            return JudgeVerdict(id=k + 1, verdict="no")
        if failure is not None:
            cmask, problem = failure
            ids = _bits(cmask)
            if problem == "number":
                reason = self._number_reason(ctx, st, ids)
            elif problem == "negation":
                reason = f"negation mismatch with {_chunks_label(ids)}"
            else:
                missing = [(w, t) for t, w, m in zip(terms, weights, masks, strict=True) if not m & cmask]
                reason = _missing_reason("not supported", st, missing)
            return JudgeVerdict(id=k + 1, verdict="no", reason=reason)
        best = 0
        if singles or pairs:
            best = min(singles[:1] + pairs[:1], key=lambda c: (c[0], c[2].bit_count()))[2]
        missing = [(w, t) for t, w, m in zip(terms, weights, masks, strict=True) if not m & best]
        return JudgeVerdict(id=k + 1, verdict="no", reason=_missing_reason("not supported", st, missing))

    @staticmethod
    def _gate(
        ctx: _Request,
        st: _Analysis,
        cmask: int,
        terms: tuple[str, ...],
        weights: list[float],
        masks: list[int],
    ) -> str | None:
        """``None`` when entities, numbers and negation agree, else what failed: entity, number, negation."""
        matched = {t: w for t, w, m in zip(terms, weights, masks, strict=True) if m & cmask}
        for t in st.proper:
            if t not in matched and t not in ctx.question:
                return "entity"
        for t in st.numbers:
            if t not in matched:
                return "number"
        best_weight = -1.0
        negated = False
        for idx in range(len(ctx.evidence)):
            if not cmask >> idx & 1:
                continue
            for clause in ctx.evidence[idx].clauses:
                w = sum(weight for t, weight in matched.items() if t in clause.terms)
                if w > best_weight:
                    best_weight = w
                    negated = clause.negated
        if negated != st.negated:
            return "negation"
        return None

    @staticmethod
    def _number_reason(ctx: _Request, st: _Analysis, ids: tuple[int, ...]) -> str:
        available: dict[str, str] = {}  # key → surface of the candidate's numbers
        for idx in ids:
            ev = ctx.evidence[idx]
            for t in ev.numbers:
                available.setdefault(t, ev.surface.get(t, t[1:]))
        missing = [t for t in st.numbers if t not in available]
        if not missing:  # matched only through an alternative form (acronym, "one"); should not happen
            return f"number mismatch with {_chunks_label(ids)}"
        shown = st.surface.get(missing[0], missing[0][1:])
        if not available:
            return f"number mismatch: {shown} not in {_chunks_label(ids)}"
        target = float(missing[0][1:])
        closest = sorted(available.items(), key=lambda kv: (abs(float(kv[0][1:]) - target), kv[0]))
        return f"number mismatch: {shown} vs {', '.join(s for _k, s in closest[:2])}"

    # -- context coverage: statement = context item, evidence = answer sentences -----------------------

    def _coverage(self, ctx: _Request, k: int, with_reason: bool) -> JudgeVerdict:
        item = ctx.statements[k]
        terms = item.terms
        if not terms:
            return JudgeVerdict(id=k + 1, verdict="no", reason="no key terms to check" if with_reason else "")
        weights = [ctx.weight(t) for t in terms]
        masks = [ctx.mask(t) for t in terms]
        total = sum(weights)
        n_ev = len(ctx.match)
        per_sentence = [0.0] * n_ev  # matched weight of the item's terms in each answer sentence
        distinct = [0] * n_ev  # matched distinctive (non-generic) terms in each answer sentence
        union_weight = 0.0
        union_distinct = 0
        strong = False
        for t, w, mask in zip(terms, weights, masks, strict=True):
            if not mask:
                continue
            union_weight += w
            generic = t in _GENERIC
            union_distinct += not generic
            strong = strong or t[0] == "#" or t in ctx.proper
            m = mask
            while m:
                low = m & -m
                idx = low.bit_length() - 1
                per_sentence[idx] += w
                distinct[idx] += not generic
                m ^= low
        share = union_weight / total
        n_distinctive = sum(t not in _GENERIC for t in terms)
        needed = min(2, n_distinctive) if n_distinctive else 1
        used = share >= self.coverage_threshold and (strong or union_distinct >= needed)
        if not used:
            # long items: an answer sentence mostly made of the item's terms uses it
            for idx in range(n_ev):
                if distinct[idx] < _SENTENCE_MIN_TERMS:
                    continue
                sentence_total = sum(ctx.weight(t) for t in ctx.evidence[idx].terms)
                if sentence_total and per_sentence[idx] / sentence_total >= _SENTENCE_SHARE:
                    used = True
                    break
        if not used:
            reason = ""
            if with_reason:
                missing = [(w, t) for t, w, m in zip(terms, weights, masks, strict=True) if not m]
                reason = _missing_reason("not used", item, missing)
                if union_weight:
                    reason += f" ({share:.0%} of key terms)"
            return JudgeVerdict(id=k + 1, verdict="no", reason=reason)
        top = max(per_sentence)
        ids = [idx + 1 for idx in range(n_ev) if distinct[idx] and per_sentence[idx] >= 0.5 * top]
        reason = ""
        if with_reason:
            where = "answer sentence" + ("s " if len(ids) > 1 else " ") + ", ".join(map(str, ids))
            reason = f"used in {where} ({share:.0%} of key terms)"
        return JudgeVerdict(id=k + 1, verdict="yes", reason=reason, chunk_ids=ids)
