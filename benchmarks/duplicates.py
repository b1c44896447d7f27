"""Duplicate rows: 8,000 rows that are 156 distinct rows repeated (distinct row ids, shuffled), judged live.

    PYTHONPATH=. python -m benchmarks.duplicates [--rows 8000] [--distinct 156] [--latency 0.1] [--runner threads]
    PYTHONPATH=. python -m benchmarks.duplicates --layout [--rows 100000] [--distinct 1000]

Against the scripted fake OpenAI server (tests/fake_openai.py, one answer per request after ``--latency`` s) in a
temporary Prefect test harness: the dry run's request and cost estimate, then the run's requests as the fake server
counted them, ``runs.requests`` and ``runs.cost_usd``. ``--layout``: what grouping identical rows into chunks costs
the flow's process (no judge): reading the blocks as before, planning the layout, reading the grouped chunks, for
a dataset of distinct rows and one of ``--distinct`` rows repeated and shuffled (row groups of 10,000 rows).
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENAI_API_KEY", "sk-bench")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "ERROR")


def duplicated_rows(rows: int, distinct: int, seed: int = 38) -> list[dict]:
    """``distinct`` rows repeated to ``rows``, each copy with its own row id, shuffled."""
    from tests.test_pipeline import make_rows

    base = make_rows(distinct, seed=seed)
    out = [{**base[i % distinct], "row_id": f"dup{i:05d}"} for i in range(rows)]
    random.Random(seed).shuffle(out)
    return out


def layout_cost(rows: int, distinct: int) -> None:
    from recall_tasks.io.blocks import iter_blocks, iter_layout, plan_layout
    from recall_tasks.io.datasets import open_dataset
    from recall_tasks.io.storage import StorageConfig
    from tests.test_pipeline import make_rows, write_parquet

    tmp = Path(tempfile.mkdtemp(prefix="dup-layout-"))
    cases = {"distinct": make_rows(rows, seed=1), "repeated": duplicated_rows(rows, distinct)}
    for name, data_rows in cases.items():
        ds = open_dataset(write_parquet(tmp / f"{name}.parquet", data_rows, 10_000), StorageConfig.from_options())
        t0 = time.perf_counter()
        sum(1 for _ in iter_blocks(ds, 500))
        t1 = time.perf_counter()
        layout = plan_layout(ds, 500)
        t2 = time.perf_counter()
        sum(1 for _ in iter_layout(ds, layout, 500))
        t3 = time.perf_counter()
        print(f"{name} ({rows:,} rows, {layout.repeats:,} repeats): contiguous blocks {t1 - t0:.2f} s, "
              f"planning {t2 - t1:.2f} s, the run's blocks {t3 - t2:.2f} s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8000)
    parser.add_argument("--distinct", type=int, default=156)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--runner", default="threads", choices=["threads", "processes"])
    parser.add_argument("--layout", action="store_true", help="only the cost of grouping rows into chunks")
    args = parser.parse_args()
    if args.layout:
        layout_cost(args.rows if args.rows != 8000 else 100_000, args.distinct if args.distinct != 156 else 1000)
        return

    from deltalake import DeltaTable
    from prefect.testing.utilities import prefect_test_harness
    from typer.testing import CliRunner

    from recall_tasks.cli import app as cli
    from recall_tasks.config import RunParams
    from recall_tasks.pipeline.flow import recall_benchmark
    from tests import judge_script
    from tests.fake_openai import FakeOpenAI
    from tests.test_pipeline import write_parquet

    tmp = Path(tempfile.mkdtemp(prefix="dup-bench-"))
    data = write_parquet(tmp / "data" / "eval.parquet", duplicated_rows(args.rows, args.distinct))
    out = tmp / "out"
    with prefect_test_harness(server_startup_timeout=120), FakeOpenAI(judge_script.responder, args.latency) as fake:
        fake.record = False
        argv = ["run", data, "-o", str(out), "--judge", "openai", "--base-url", fake.base_url, "--dry-run"]
        dry = CliRunner().invoke(cli.app, argv, env={"COLUMNS": "400"}).output
        print("\n".join(line for line in dry.splitlines() if line.startswith(("dry run:", "cost:"))))
        est_requests = int(re.search(r"(\d+) judge requests", dry).group(1))  # type: ignore[union-attr]
        est_cost = float(re.search(r"cost: ~\$([\d.]+) live", dry).group(1))  # type: ignore[union-attr]
        fake.stats.clear()
        started = time.perf_counter()
        params = RunParams(dataset_uri=data, output_uri=str(out), judge="openai", base_url=fake.base_url,
                           task_runner=args.runner, workers=2 if args.runner != "threads" else None)  # fmt: skip
        recall_benchmark(params)
        wall = time.perf_counter() - started
        run = DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist()[-1]
        results = DeltaTable(str(out / "results")).to_pyarrow_table()
        print(f"run ({args.runner}): {len(fake.chat_arrivals)} chat requests at the fake server, runs.requests "
              f"{run['requests']}, cost_usd {run['cost_usd']:.6f}, {results.num_rows} result rows, "
              f"{len(set(results.column('row_id').to_pylist()))} distinct row ids, {wall:.1f} s")  # fmt: skip
        off_requests = 100 * (est_requests - run["requests"]) / max(run["requests"], 1)
        off_cost = 100 * (est_cost - run["cost_usd"]) / max(run["cost_usd"], 1e-12)
        print(f"dry run vs run: requests {est_requests} vs {run['requests']} ({off_requests:+.1f} %), "
              f"cost {est_cost:.6f} vs {run['cost_usd']:.6f} ({off_cost:+.1f} %)")  # fmt: skip


if __name__ == "__main__":
    main()
