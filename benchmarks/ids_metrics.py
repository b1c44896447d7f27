"""The id-based retrieval metrics at scale: recall-bench's vectorized computation against ir-measures, same input.

    PYTHONPATH=. .venv/bin/python benchmarks/ids_metrics.py [--queries 100000] [--retrieved 20] [--ks 1,5,10]
        [--repeat 3] [--skip-reference]

One process: the 1-minute load average first, then a synthetic run of ``--queries`` queries, each retrieving
``--retrieved`` string ids (about 1 in 20 a repeat of an earlier one) and judging 1-6 ids with grades 0-3 (about
half of them among those retrieved). recall-bench: ``normalise_ids`` on both columns, ``normalise_relevance``
and ``id_metrics`` (5 metrics x each k), from Arrow columns, the median of ``--repeat`` runs. ir-measures (the
reference of tests/test_ids_compute.py: pytrec_eval for P, R, Success and nDCG, its own provider for RR@k): the
same 5 x k measures per query with ``iter_calc``, once, timed apart from building its qrels/run dicts from the same
Arrow columns. Peak RSS is the process's (``ru_maxrss``) after recall-bench ran, before ir-measures, next to the
input's own. Figures printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recall_tasks.metrics.ids_compute import (  # noqa: E402
    METRICS,
    id_metrics,
    metric_names,
    normalise_ids,
    normalise_relevance,
    parse_ks,
)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def synthetic(queries: int, retrieved: int, seed: int = 41) -> tuple[pa.ListArray, pa.ListArray, pa.ListArray]:
    """Retrieved ids (rank order, a few repeats), relevant ids and their grades, as Arrow list<string>/list<int>."""
    rng = np.random.default_rng(seed)
    docs = rng.integers(0, 5_000_000, size=(queries, retrieved))
    repeat = rng.random((queries, retrieved)) < 0.05
    repeat[:, 0] = False
    earlier = (rng.random((queries, retrieved)) * np.arange(retrieved)).astype(np.int64)
    docs = np.where(repeat, np.take_along_axis(docs, earlier, axis=1), docs)
    r_offsets = np.arange(0, queries * retrieved + 1, retrieved, dtype=np.int32)
    r_values = pc.binary_join_element_wise("doc-", pa.array(docs.ravel()).cast(pa.string()), "")
    n_rel = rng.integers(1, 7, size=queries)
    g_offsets = np.concatenate([[0], np.cumsum(n_rel)]).astype(np.int32)
    g_rows = np.repeat(np.arange(queries), n_rel)
    from_run = rng.random(len(g_rows)) < 0.5
    picked = docs[g_rows, rng.integers(0, retrieved, size=len(g_rows))]
    g_docs = np.where(from_run, picked, rng.integers(0, 5_000_000, size=len(g_rows)))
    g_values = pc.binary_join_element_wise("doc-", pa.array(g_docs).cast(pa.string()), "")
    grades = rng.integers(0, 4, size=len(g_rows))
    return (
        pa.ListArray.from_arrays(pa.array(r_offsets), r_values),
        pa.ListArray.from_arrays(pa.array(g_offsets), g_values),
        pa.ListArray.from_arrays(pa.array(g_offsets), pa.array(grades)),
    )


def ours(retrieved: pa.ListArray, relevant: pa.ListArray, grades: pa.ListArray, ks: tuple[int, ...]) -> pa.Table:
    r = normalise_ids(retrieved, column="retrieved_context_ids", source="bench")
    g = normalise_ids(relevant, column="reference_context_ids", source="bench")
    rel = normalise_relevance(grades, g, column="reference_context_relevance", source="bench")
    return id_metrics(r, g, rel, ks)


def reference_inputs(
    retrieved: pa.ListArray, relevant: pa.ListArray, grades: pa.ListArray
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]]]:
    """ir-measures' qrels and run dicts (a judged id twice: its highest grade; a repeat keeps its first rank)."""
    qrels: dict[str, dict[str, int]] = {}
    for i, (ids, gs) in enumerate(zip(relevant.to_pylist(), grades.to_pylist(), strict=True)):
        judged: dict[str, int] = {}
        for doc, grade in zip(ids, gs, strict=True):
            judged[doc] = max(grade, judged.get(doc, grade))
        qrels[str(i)] = judged
    run: dict[str, dict[str, float]] = {}
    for i, ids in enumerate(retrieved.to_pylist()):
        unique = list(dict.fromkeys(ids))
        run[str(i)] = {doc: float(len(unique) - r) for r, doc in enumerate(unique)}
    return qrels, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=100_000)
    parser.add_argument("--retrieved", type=int, default=20, help="ids retrieved per query")
    parser.add_argument("--ks", default="1,5,10")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-reference", action="store_true", help="recall-bench only (no ir-measures)")
    args = parser.parse_args()
    ks = parse_ks(args.ks)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    load = os.getloadavg()[0]
    print(f"id metrics at commit {commit or 'unknown'}; 1-minute load before: {load:.2f} on {os.cpu_count()} cores")
    retrieved, relevant, grades = synthetic(args.queries, args.retrieved)
    input_rss = peak_rss_mb()
    print(
        f"input: {args.queries:,} queries x {args.retrieved} retrieved ids, {len(relevant.flatten()):,} judged ids; "
        f"{len(metric_names(ks))} metrics ({', '.join(METRICS)} at k={args.ks})"
    )
    times, cpus = [], []
    for _ in range(max(args.repeat, 1)):
        t0, c0 = time.perf_counter(), time.process_time()
        table = ours(retrieved, relevant, grades, ks)
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    mine = statistics.median(times)
    print(
        f"recall-bench: {mine:.3f} s wall (median of {len(times)}: {', '.join(f'{t:.3f}' for t in times)}; CPU "
        f"{statistics.median(cpus):.3f} s), {args.queries / mine:,.0f} rows/s; peak RSS {peak_rss_mb():.0f} MB "
        f"(input alone {input_rss:.0f} MB)"
    )
    if args.skip_reference:
        return
    import ir_measures
    from ir_measures import RR, P, R, Success, nDCG

    measures = [m @ k for k in ks for m in (R, P, Success, RR, nDCG)]
    t0 = time.perf_counter()
    qrels, run = reference_inputs(retrieved, relevant, grades)
    built = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    values: dict[tuple[str, str], float] = {
        (m.query_id, str(m.measure)): m.value for m in ir_measures.iter_calc(measures, qrels, run)
    }
    calc, calc_cpu = time.perf_counter() - t0, time.process_time() - c0
    print(
        f"ir-measures: {calc:.2f} s wall computing (CPU {calc_cpu:.2f} s; {args.queries / calc:,.0f} rows/s) + "
        f"{built:.2f} s building its dicts from the Arrow columns; {len(values):,} values"
    )
    print(f"ratio: recall-bench {calc / mine:.0f}x faster than ir-measures' computation, {(calc + built) / mine:.0f}x "
          "with its dicts built")  # fmt: skip
    names = {"recall": "R@{}", "precision": "P@{}", "hit_rate": "Success@{}", "mrr": "RR@{}", "ndcg": "nDCG@{}"}
    worst = 0.0
    for name in table.column_names:
        metric, k = name.split("@")
        got = table.column(name).to_numpy(zero_copy_only=False)
        for i in range(0, args.queries, max(args.queries // 2000, 1)):
            want = values.get((str(i), names[metric].format(k)))
            if want is not None and not np.isnan(got[i]):
                worst = max(worst, abs(got[i] - want))
    print(f"largest difference on a sample of rows: {worst:.1e}")


if __name__ == "__main__":
    main()
