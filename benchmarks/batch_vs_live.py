"""Live vs ``--batch`` on the same rows against the scripted fake server: requests, cost, wall time.

    PYTHONPATH=. python -m benchmarks.batch_vs_live [ROWS] [LATENCY_S]

Runs the flow in a temporary Prefect test harness. The batch wall time is the client's work (preparing and
uploading; then collecting and finishing), not the provider's queue (up to 24 h) nor the fake's processing.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENAI_API_KEY", "sk-bench")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "ERROR")


def main(rows: int = 10_000, latency_s: float = 0.2) -> None:
    from prefect.testing.utilities import prefect_test_harness

    from recall_tasks.config import RunParams
    from recall_tasks.pipeline.flow import recall_benchmark
    from tests import judge_script
    from tests.fake_openai import FakeOpenAI
    from tests.test_pipeline import make_rows, write_parquet

    tmp = Path(tempfile.mkdtemp(prefix="batch-bench-"))
    data = write_parquet(tmp / "data" / "eval.parquet", make_rows(rows))
    with prefect_test_harness(server_startup_timeout=120), FakeOpenAI(judge_script.responder, latency_s) as fake:
        fake.record = False
        common = {"dataset_uri": data, "judge": "openai", "base_url": fake.base_url, "max_concurrency": 100}
        for mode in ("live", "batch"):
            fake.stats.clear()
            fake.batch_hold = True
            started = time.perf_counter()
            params = RunParams(**common, output_uri=str(tmp / mode), batch=mode == "batch")
            summary = recall_benchmark(params)
            submitted = time.perf_counter() - started
            if mode == "batch":
                from recall_tasks.cli.outcome import pending_lines

                if summary["status"] == "batch_pending":  # what `run --batch` prints after the submit
                    print("\n".join(pending_lines(summary)))
                fake.finish_batches()  # the provider's part, not timed
                started = time.perf_counter()
                summary = recall_benchmark(params)  # the fake finished at once: this collects
                print(f"batch: submit {submitted:.1f} s, collect+finish {time.perf_counter() - started:.1f} s")
            total = submitted if mode == "live" else submitted + time.perf_counter() - started
            chat = fake.stats["ok"] + sum(v for k, v in fake.stats.items() if k.startswith(("fault", "malformed")))
            print(f"{mode}: {summary['rows']} rows, {summary['requests']} requests recorded, {chat} live chat "
                  f"calls, {fake.stats['batch:create']} batch(es), cost ${summary['cost_usd']:.4f}, "
                  f"wall {total:.1f} s, mean {summary['mean_score']:.4f}")  # fmt: skip
            if summary["status"] != "batch_pending" and summary["status"] != "batch_idle" and mode == "batch":
                print(f"runs.batch_ids {summary['batch_ids']}, runs.batch_wait_s {summary['batch_wait_s']:.1f}")


if __name__ == "__main__":
    main(*(int(sys.argv[1]),) if len(sys.argv) > 1 else (), *(float(sys.argv[2]),) if len(sys.argv) > 2 else ())
