"""Scale: whole ``recall-bench run`` processes on 10,000, 100,000 and 1,000,000 rows (issue 42, item 3).

    python -m benchmarks.scale [--rows 10000 100000 1000000] [--chunk-size 2000] [--concurrency 64] [--keep]

The harness of ``benchmarks/throughput.py`` (its row generator, its zero-latency fake judge and its Prefect
server, started once for every size) and of ``benchmarks/startup.py`` (its environment and its whole-process
run): each size is a fresh dataset (distinct rows, written in batches of 50,000 so that this process never
holds a million rows) and a fresh ``recall-bench run DATA --output NEW --judge openai --chunk-size 2000``
process writing Delta into a temporary folder. Per size, printed, never asserted:

- the 1-minute load before the run, stamped ``loaded`` above 1 (``benchmarks/load.py``);
- rows/s over the scoring window (the fake judge's first request to its last answer) and over the whole
  process (start-up, planning, commit and report included);
- peak RSS of the run process: ``benchmarks/_peak_rss.py`` spawns it and reads ``RUSAGE_CHILDREN`` (spawned
  from this process, its ``ru_maxrss`` would start from what this process held);
- its resident base: RSS read every ``--rss-every`` seconds, the median of each quarter of the run's time (a
  median passes over the spikes of a row group's read), and the creep from the second quarter's to the last's in
  bytes a row (rows judged at an even pace: half the rows between the two);
- judge calls per row (the fake judge's count);
- the files of the result tables: data files of ``results/``, ``runs/`` and ``comparisons/`` and the files in
  each ``_delta_log/``;
- the wall time of ``recall-bench history --output X`` and of ``recall-bench query "SELECT count(*),
  avg(score) FROM results" --output X`` after the run, each a fresh process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks import load
from benchmarks.startup import child_env, one_run
from benchmarks.throughput import ROOT, free_port, make_table, start_judge, start_prefect_server

BATCH = 50_000
TABLES = ("results", "runs", "comparisons")
QUERY = "SELECT count(*), avg(score) FROM results"


def write_rows(path: Path, rows: int) -> str:
    """``rows`` distinct generated rows in one Parquet file (row groups of :data:`BATCH`), made batch by batch:
    each batch is ``make_table`` with its own seed, its row ids numbered on from the previous batch's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer: pq.ParquetWriter | None = None
    for start in range(0, rows, BATCH):
        batch = make_table(min(BATCH, rows - start), seed=start)
        ids = pa.array([f"q{start + i:07d}" for i in range(batch.num_rows)])
        batch = batch.set_column(batch.column_names.index("row_id"), "row_id", ids)
        writer = writer or pq.ParquetWriter(path, batch.schema)
        writer.write_table(batch, row_group_size=BATCH)
    if writer is not None:
        writer.close()
    return str(path)


def file_counts(out: Path) -> dict[str, int]:
    """Per table: its data files (everything outside ``_delta_log``) and the files in its ``_delta_log``."""
    counts: dict[str, int] = {}
    for table in TABLES:
        files = [p for p in (out / table).rglob("*") if p.is_file()]
        log = [p for p in files if "_delta_log" in p.relative_to(out / table).parts]
        counts[table] = len(files) - len(log)
        counts[f"{table}_log"] = len(log)
    return counts


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Wall seconds of a whole CLI process and its stdout; a failure raises with its output."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[3:5]} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return wall, proc.stdout


def quarter_medians(trace: list[list[float]]) -> list[float]:
    """The median RSS (MiB) of each quarter of the traced time (``[[seconds, MiB], ...]``); [] when a quarter has
    no sample (a run shorter than a few reads)."""
    end = trace[-1][0] if trace else 0.0
    quarters: list[list[float]] = [[], [], [], []]
    for t, mib in trace:
        quarters[min(int(4 * t / end), 3) if end > 0 else 0].append(mib)
    return [statistics.median(q) for q in quarters] if all(quarters) else []


def creep_bytes_per_row(medians: list[float], rows: int) -> float | None:
    """Resident growth from the second quarter's median to the last's, per row (half the rows lie between)."""
    if len(medians) != 4 or rows < 2:
        return None
    return (medians[3] - medians[1]) * 2**20 / (rows / 2)


def one_size(tmp: Path, env: dict[str, str], base_url: str, rows: int, args: argparse.Namespace) -> dict:
    data = write_rows(tmp / f"data-{rows}" / "bench.parquet", rows)
    out = tmp / f"out-{rows}"
    rss_file = tmp / f"rss-{rows}.json"
    cli = [sys.executable, "-m", "recall_tasks"]
    cmd = [sys.executable, str(ROOT / "benchmarks" / "_peak_rss.py"), str(rss_file), *cli, "run", data,
           "--output", str(out), "--judge", "openai", "--base-url", base_url, "--chunk-size", str(args.chunk_size),
           "--max-concurrency", str(args.concurrency)]  # fmt: skip
    before = load.settle(args.settle_s)
    stats_url = base_url.removesuffix("/v1") + "/stats"
    run = one_run(cmd, {**env, "PEAK_RSS_EVERY_S": str(args.rss_every)}, ROOT, stats_url, tmp / f"run-{rows}.log")
    stats = json.loads(Path(rss_file).read_text())
    medians = quarter_medians(stats.get("rss_trace", []))
    judge = json.loads(urllib.request.urlopen(stats_url, timeout=5).read())
    window = judge["last_response_at"] - judge["first_request_at"]
    shutil.rmtree(Path(data).parent, ignore_errors=True)  # the dataset is not needed after its run
    history_s, _ = timed([*cli, "history", "--output", str(out)], env)
    query_s, answer = timed([*cli, "query", QUERY, "--output", str(out), "--output-format", "json"], env)
    return {
        "rows": rows, "load": before, "wall_s": run["wall_s"], "window_s": window, "cpu_s": run["cpu_s"],
        "peak_rss_mib": stats["peak_rss_kb"] / 1024, "rss_quarters_mib": [round(m) for m in medians],
        "creep_b_per_row": creep_bytes_per_row(medians, rows), "requests": judge["requests"], "history_s": history_s,
        "query_s": query_s, "query": answer.strip(), **file_counts(out),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--chunk-size", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64, help="--max-concurrency (the CLI's default)")
    parser.add_argument("--settle-s", type=float, default=0.0, help="wait up to this for the load to fall to 1")
    parser.add_argument("--rss-every", type=float, default=2.0, help="seconds between RSS reads of the run")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (outputs, logs)")
    args = parser.parse_args()

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    tmp = Path(tempfile.mkdtemp(prefix="recall-scale-"))
    prefect, api_url = start_prefect_server(tmp / "prefect")
    judge, base_url = start_judge(0.0, tmp)
    env = {**child_env(tmp, ROOT, free_port()), "PREFECT_API_URL": api_url, "PREFECT_LOGGING_LEVEL": "WARNING"}
    results = []
    try:
        for rows in args.rows:
            results.append(one_size(tmp, env, base_url, rows, args))
            r = results[-1]
            print(f"{rows} rows done: {json.dumps(r)}", file=sys.stderr, flush=True)
    finally:
        for proc in (judge, prefect):
            proc.terminate()
            proc.wait(timeout=30)
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    print(f"\nrecall-bench scale at {commit.stdout.strip()} (HEAD when the script started): zero-latency fake judge, "
          f"--chunk-size {args.chunk_size}, "
          f"--max-concurrency {args.concurrency}, Delta, {os.cpu_count()} cores visible, "
          f"affinity {sorted(os.sched_getaffinity(0))}\n")  # fmt: skip
    header = (f"{'rows':>9} {'load':>11} {'rows/s win':>10} {'rows/s all':>10} {'window s':>9} {'wall s':>8} "
              f"{'peak RSS MiB':>12} {'calls/row':>9} {'results':>13} {'runs':>9} {'comparisons':>11} "
              f"{'history s':>9} {'query s':>8}")  # fmt: skip
    print(header)
    print("-" * len(header))
    for r in results:
        files = {t: f"{r[t]}+{r[t + '_log']} log" for t in TABLES}
        print(f"{r['rows']:>9,} {r['load']:>5.2f} {load.stamp([r['load']]):>5} {r['rows'] / r['window_s']:>10.0f} "
              f"{r['rows'] / r['wall_s']:>10.0f} {r['window_s']:>9.1f} {r['wall_s']:>8.1f} {r['peak_rss_mib']:>12.0f} "
              f"{r['requests'] / r['rows']:>9.2f} {files['results']:>13} {files['runs']:>9} "
              f"{files['comparisons']:>11} {r['history_s']:>9.2f} {r['query_s']:>8.2f}")  # fmt: skip
    for r in results:
        creep = r["creep_b_per_row"]
        print(f"resident base of the {r['rows']:,}-row run, median of each quarter of its time: "
              f"{' / '.join(f'{m:,}' for m in r['rss_quarters_mib'])} MiB; creep from the second quarter to the last: "
              f"{'-' if creep is None else f'{creep:.0f}'} bytes a row")  # fmt: skip
    for r in results:
        print(f"query on {r['rows']:,} rows answered: {r['query']}")
    print(f"\nfiles: data files + files in _delta_log per table; window: the fake judge's first request to its last "
          f"answer; all: the whole run process.\n{load.summary([r['load'] for r in results])}")  # fmt: skip
    if any(load.stamp([r["load"]]) == "loaded" for r in results):
        print(load.NOT_FOR_README)


if __name__ == "__main__":
    main()
