"""A year of nights on Delta and on Iceberg: read times before and after ``recall-bench maintain``, and what one
run's commit costs (seconds, files) at 100k rows.

    python benchmarks/warehouse_nights.py [--nights 365] [--rows 50] [--big-rows 100000] [--repeat 3]

Nights are simulated through the result store's commit (``ResultStore.commit``: one chunk file of ``--rows`` rows
with a ``category`` segment column, an overall runs row plus one per segment, one ``run_date`` partition per
night), not full runs, so a year takes minutes. Iceberg uses the embedded SQLite catalog on local disk; Delta a
local folder. Then, for each format, before and after maintenance (``--keep-days 0``):

* ``history``: ``recall-bench history -o OUT --limit 0 --output-format json`` as a process (its whole wall time);
* baseline lookup: in-process, ``read_table("runs").to_table()`` then ``find_baseline`` (what a run does after
  its commit);
* ``query``: ``recall-bench query "SELECT count(*) FROM results"`` as a process;

each the median of ``--repeat`` runs, alternating the formats. Last, one commit of ``--big-rows`` rows into a
fresh output per format: seconds and the data/metadata files it added. Figures printed, never asserted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recall_tasks.analysis.baseline import find_baseline  # noqa: E402
from recall_tasks.io.maintenance import maintain  # noqa: E402
from recall_tasks.io.results import ChunkPart, ResultStore  # noqa: E402
from recall_tasks.io.storage import StorageConfig  # noqa: E402

FORMATS = ("delta", "iceberg")
CLI = [sys.executable, "-m", "recall_tasks"]


def chunk_table(rows: int, night: int) -> pa.Table:
    scores = [((i * 7 + night) % 11) / 10 for i in range(rows)]
    return pa.table({
        "row_id": [f"r{i:06d}" for i in range(rows)], "score": scores, "success": [s >= 0.5 for s in scores],
        "cached": [False] * rows, "error": pa.nulls(rows, pa.string()), "skipped": [False] * rows,
        "category": [("a", "b", "c")[i % 3] for i in range(rows)],
    })  # fmt: skip


def commit_night(store: ResultStore, night: int, rows: int) -> None:
    run_id = f"night-{night:04d}"
    day = (dt.date(2026, 1, 1) + dt.timedelta(days=night)).isoformat()
    path = store.chunk_path(f"{night:04d}".ljust(32, "0"), run_id)
    table = chunk_table(rows, night)
    store.write_chunk(path, table)
    started = dt.datetime(2026, 1, 1, 2, tzinfo=dt.UTC) + dt.timedelta(days=night)
    base = {"run_id": run_id, "dataset": "golden", "run_date": day, "metric": "contextual_recall",
            "status": "completed", "started_at": started, "finished_at": started + dt.timedelta(minutes=3),
            "judge": "openai", "units": "sentences", "rows": rows}  # fmt: skip
    runs = [{**base, "mean_score": sum(table.column("score").to_pylist()) / rows}]
    runs += [{**base, "segment_column": "category", "segment_value": v, "rows": rows // 3} for v in "abc"]
    store.commit(run_id, "golden", day, [ChunkPart(path)], runs)


def timed_process(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([*CLI, *args], check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - t0


def baseline_lookup(out: str, fmt: str) -> float:
    t0 = time.perf_counter()
    store = ResultStore(out, StorageConfig.from_options(), fmt)  # type: ignore[arg-type]
    runs = store.read_table("runs").to_table()  # type: ignore[union-attr]
    assert find_baseline(runs, dataset="golden", metric="contextual_recall") is not None
    return time.perf_counter() - t0


def files(folder: Path) -> int:
    return sum(len(names) for _, _, names in os.walk(folder))


def reads(outs: dict[str, str], repeat: int) -> dict[str, dict[str, float]]:
    got: dict[str, dict[str, list[float]]] = {f: {"history": [], "baseline": [], "query": []} for f in outs}
    for _ in range(repeat):
        for fmt, out in outs.items():  # alternating: the machine's load falls on both formats alike
            got[fmt]["history"].append(timed_process(["history", "-o", out, "--limit", "0", "--output-format", "json"]))
            got[fmt]["baseline"].append(baseline_lookup(out, fmt))
            got[fmt]["query"].append(timed_process(["query", "SELECT count(*) FROM results", "-o", out]))
    return {f: {k: statistics.median(v) for k, v in d.items()} for f, d in got.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nights", type=int, default=365)
    parser.add_argument("--rows", type=int, default=50)
    parser.add_argument("--big-rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rb-nights-"))
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> None:
    outs = {fmt: str(work / fmt) for fmt in FORMATS}
    stores = {fmt: ResultStore(out, StorageConfig.from_options(), fmt) for fmt, out in outs.items()}  # type: ignore[arg-type]
    commit_s: dict[str, list[float]] = {f: [] for f in FORMATS}
    for night in range(args.nights):
        for fmt, store in stores.items():
            t0 = time.perf_counter()
            commit_night(store, night, args.rows)
            commit_s[fmt].append(time.perf_counter() - t0)
    print(f"{args.nights} nights of {args.rows} rows (4 runs rows each), at commit {_commit()}")
    for fmt in FORMATS:
        first, last = commit_s[fmt][:10], commit_s[fmt][-10:]
        print(f"  {fmt:8} commit: first 10 nights median {statistics.median(first):.3f} s, last 10 "
              f"{statistics.median(last):.3f} s; files under the output {files(Path(outs[fmt]))}")  # fmt: skip
    before = reads(outs, args.repeat)
    maintained = {}
    for fmt in FORMATS:
        t0 = time.perf_counter()
        rows = maintain(
            ResultStore(outs[fmt], StorageConfig.from_options(), fmt), keep_days=0, allow_short_retention=True
        )  # type: ignore[arg-type]
        maintained[fmt] = (time.perf_counter() - t0, rows)
    after = reads(outs, args.repeat)
    print(f"read times (median of {args.repeat}, seconds): before -> after maintenance")
    for fmt in FORMATS:
        cells = ", ".join(f"{k} {before[fmt][k]:.2f} -> {after[fmt][k]:.2f}" for k in ("history", "baseline", "query"))
        print(f"  {fmt:8} {cells}")
        seconds, rows = maintained[fmt]
        print(f"  {fmt:8} maintain {seconds:.1f} s: " + "; ".join(
            f"{r['table']} {r['data_files_before']} -> {r['data_files_after']} data files, {r['versions']}, "
            f"{r['files_deleted']} files deleted" for r in rows))  # fmt: skip
        print(f"  {fmt:8} files under the output after maintenance {files(Path(outs[fmt]))}")
    print(f"one commit of {args.big_rows} rows into a fresh output (median of {args.repeat}):")
    for fmt in FORMATS:
        seconds, added = [], []
        for i in range(args.repeat):
            out = work / f"big-{fmt}-{i}"
            store = ResultStore(str(out), StorageConfig.from_options(), fmt)  # type: ignore[arg-type]
            commit_night(store, 0, args.big_rows)  # creates the tables: the measured commit is the second
            before_files = files(out / "results") + files(out / "runs")
            t0 = time.perf_counter()
            commit_night(store, 1, args.big_rows)
            seconds.append(time.perf_counter() - t0)
            added.append(files(out / "results") + files(out / "runs") - before_files)
        print(f"  {fmt:8} {statistics.median(seconds):.2f} s, {statistics.median(added):.0f} files added "
              "under results/ and runs/ (data, manifests, metadata)")  # fmt: skip


def _commit() -> str:
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return found.stdout.strip() or "?"


if __name__ == "__main__":
    main()
