"""``--metric retrieval_ids`` end to end: 100,000 rows from Parquet on S3 (the suite's SeaweedFS) to committed Delta
tables on S3, through the Prefect flow (a test harness server), no judge. Prints the wall time of the run (plan,
chunks, commit, comparison), rows/s, the process's peak RSS and the machine's load.

    PYTHONPATH=. python -m benchmarks.ids_run [--rows 100000] [--chunk-size 5000]

Each row has 10 retrieved chunk ids (``doc-N::chunk-M``, mapped by ``--id-pattern``) and 3 relevant ids. Figures
printed, never asserted (docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--chunk-size", type=int, default=5000)
    args = parser.parse_args()
    from prefect.testing.utilities import prefect_test_harness

    from recall_tasks.config import RunParams
    from recall_tasks.pipeline.flow import recall_benchmark
    from tests.s3_server import start_server

    rng = random.Random(1)
    n = args.rows
    table = pa.table({
        "row_id": [f"q{i}" for i in range(n)],
        "question": [f"question {i}" for i in range(n)],
        "retrieved_context_ids": [[f"doc-{rng.randrange(5000)}::chunk-{j}" for j in range(10)] for _ in range(n)],
        "reference_context_ids": [[f"doc-{rng.randrange(5000)}" for _ in range(3)] for _ in range(n)],
    })  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="rb-ids-bench-"))
    (work / "weed").mkdir()
    server = start_server(work / "weed")
    try:
        os.environ.update(server.env())
        bucket = server.make_bucket()
        pq.write_table(table, work / "eval.parquet", row_group_size=20_000)
        server.client().upload_file(str(work / "eval.parquet"), bucket, "data/eval.parquet")
        params = RunParams(
            dataset_uri=f"s3://{bucket}/data/eval.parquet", output_uri=f"s3://{bucket}/out", metric="retrieval_ids",
            id_pattern="^(.+)::", chunk_size=args.chunk_size,
        )  # fmt: skip
        with prefect_test_harness():
            started = time.perf_counter()
            summary = recall_benchmark(params)
            wall = time.perf_counter() - started
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"rows={summary['rows']} wall_s={wall:.1f} rows_per_s={n / wall:,.0f} peak_rss_mb={rss:.0f} "
            f"requests={summary['requests']} load={os.getloadavg()[0]:.1f} cores={len(os.sched_getaffinity(0))}"
        )
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
