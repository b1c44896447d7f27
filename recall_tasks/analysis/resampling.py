"""The arithmetic behind :mod:`~recall_tasks.analysis.agreement`: per-row counts and scores as arrays, each
figure computed for many bootstrap replicates at once (a replicate is a row of a (k, n) multiplicity matrix: how
often it drew each row), the seeded resampling itself and the percentile interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

#: The figures :func:`~recall_tasks.analysis.agreement.agreement` reports, in display order.
FIGURES = ("accuracy", "kappa", "tpr", "tnr", "mae", "spearman")

Array = npt.NDArray[np.float64]


class Paired(Protocol):
    """What :class:`RowTable` reads of a row (:class:`~recall_tasks.analysis.agreement.PairedRow`)."""

    @property
    def human(self) -> Sequence[bool]: ...

    @property
    def judge(self) -> Sequence[bool]: ...

    @property
    def key(self) -> str | None: ...

    def scores(self) -> tuple[float | None, float | None]: ...


def kappa_rows(counts: Array) -> Array:
    """κ per row of an (k, 4) array of (tp, fn, fp, tn); NaN where the human labels are one class."""
    tp, fn, fp, tn = counts.T
    n = counts.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        po = (tp + tn) / n
        human_pos, judge_pos = (tp + fn) / n, (tp + fp) / n
        pe = human_pos * judge_pos + (1 - human_pos) * (1 - judge_pos)
        k = (po - pe) / (1 - pe)
    one_class = (tp + fn == 0) | (fp + tn == 0)
    return np.where(one_class | (n == 0), np.nan, k)


def spearman_rows(x: Array, y: Array, w: Array) -> Array:
    """ρ per row of the (k, n) multiplicity matrix ``w`` (a bootstrap replicate repeats row i w[r, i] times).

    Ranks of a sample with repeats come from the distinct values: the average rank of value v is
    (draws below v) + (draws of v + 1) / 2.
    """
    k = w.shape[0]
    if len(x) == 0:
        return np.full(k, np.nan)

    def ranks(v: Array) -> Array:
        distinct, inverse = np.unique(v, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        starts = np.searchsorted(inverse[order], np.arange(len(distinct)))
        count = np.add.reduceat(w[:, order], starts, axis=1)  # (k, distinct): how often each value was drawn
        rank = np.cumsum(count, axis=1) - count + (count + 1.0) / 2.0
        return np.asarray(rank[:, inverse], dtype=np.float64)  # (k, n): each original row's rank per replicate

    rx, ry = ranks(x), ranks(y)
    total = w.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        mx = (w * rx).sum(axis=1, keepdims=True) / total
        my = (w * ry).sum(axis=1, keepdims=True) / total
        cov = (w * (rx - mx) * (ry - my)).sum(axis=1)
        vx = (w * (rx - mx) ** 2).sum(axis=1)
        vy = (w * (ry - my) ** 2).sum(axis=1)
        rho = cov / np.sqrt(vx * vy)
    few = (w > 0).sum(axis=1) < 2
    flat = (vx <= 1e-12) | (vy <= 1e-12)
    return np.where(few | flat | (total[:, 0] < 3), np.nan, rho)


@dataclass
class RowTable:
    """Per-row counts and scores as arrays, so a replicate's figures are a matrix product."""

    counts: Array  # (n, 4): tp, fn, fp, tn per row
    scored: npt.NDArray[np.bool_]  # (n,): row has both scores
    human: Array  # (n,) scores (NaN where missing)
    judge: Array
    keys: list[str | None] = field(default_factory=list)

    @classmethod
    def of(cls, rows: Sequence[Paired]) -> RowTable:
        counts = np.zeros((len(rows), 4), dtype=np.float64)
        human = np.full(len(rows), np.nan)
        judge = np.full(len(rows), np.nan)
        for i, r in enumerate(rows):
            for h, j in zip(r.human, r.judge, strict=True):
                counts[i, (0 if j else 1) if h else (2 if j else 3)] += 1
            hs, js = r.scores()
            if hs is not None and js is not None:
                human[i], judge[i] = hs, js
        return cls(counts, ~np.isnan(human) & ~np.isnan(judge), human, judge, [r.key for r in rows])

    def figures(self, w: Array) -> dict[str, Array]:
        """Each figure for each replicate (row of the (k, n) multiplicity matrix ``w``); NaN where undefined."""
        c = w @ self.counts
        tp, fn, fp, tn = c.T
        n = c.sum(axis=1)
        ws = w[:, self.scored]
        with np.errstate(divide="ignore", invalid="ignore"):
            out = {
                "accuracy": (tp + tn) / n,
                "kappa": kappa_rows(c),
                "tpr": tp / (tp + fn),
                "tnr": tn / (tn + fp),
                "mae": ws @ np.abs(self.human[self.scored] - self.judge[self.scored]) / ws.sum(axis=1),
                "spearman": spearman_rows(self.human[self.scored], self.judge[self.scored], ws),
            }
        return {k: np.where(np.isfinite(v), v, np.nan) for k, v in out.items()}


def resample(rng: np.random.Generator, n: int, resamples: int) -> Array:
    """(resamples, n) multiplicities: each replicate draws n rows with replacement."""
    if n == 0:
        return np.zeros((resamples, 0))
    return rng.multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(np.float64)


def chunks(n: int, resamples: int) -> list[int]:
    """Replicates per chunk, so a chunk's (replicates, n) matrices stay ~16 MB whatever the set's size."""
    size = max(1, min(resamples, 2_000_000 // max(n, 1)))
    return [min(size, resamples - i) for i in range(0, resamples, size)]


def bootstrap(tables: Sequence[RowTable], order: list[int] | None, resamples: int, seed: int) -> list[dict[str, Array]]:
    """Each table's figures over the same seeded replicates; with ``order`` (two tables of the same rows) the
    second reuses the first's draws, row i of the first being row order[i] of the second."""
    rng = np.random.default_rng(seed)
    parts: list[list[dict[str, Array]]] = [[] for _ in tables]
    n0 = len(tables[0].counts)
    for size in chunks(max(len(t.counts) for t in tables), resamples):
        w0 = resample(rng, n0, size)
        for t, table in enumerate(tables):
            if t == 0:
                w = w0
            elif order is not None:
                w = np.zeros_like(w0)
                w[:, order] = w0
            else:
                w = resample(rng, len(table.counts), size)
            parts[t].append(table.figures(w))
    return [{name: np.concatenate([p[name] for p in chunks]) for name in FIGURES} for chunks in parts]


def interval(values: Array, confidence: float) -> tuple[float | None, float | None, float]:
    ok = values[~np.isnan(values)]
    undefined = 1.0 - len(ok) / len(values) if len(values) else 1.0
    if len(ok) == 0:
        return None, None, undefined
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(ok, [tail, 100 - tail])
    return float(low), float(high), undefined
