"""Fleet-wide --rpm measured: three runs sharing one quota against the quota-enforcing fake OpenAI server.

    python -m benchmarks.rate_limit [--rpm 1200] [--rows 300] [--runs 3]

A real Prefect server (``benchmarks/throughput.start_prefect_server``) and ``tests/fake_openai.FakeOpenAI`` in this
process with ``rpm_quota`` (a sliding 10 s window: at most rpm/6 requests in any 10 s, 429 beyond it) and the test
judge script. ``--runs`` processes each run the real flow (``recall_benchmark``) on their own dataset with
``--rpm`` and ``--max-retries 0`` (a 429 is a row error, never hidden by a retry), all started at once. Printed:
requests the server received, 429s it sent, the achieved rate as a share of the quota from the first to the last
accepted request, the busiest 10 s window, and per process the grants it acquired, refused increments and reads
that said "not yet". Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.throughput import ROOT, start_prefect_server


def child(data: str, out: str, base_url: str, rpm: int) -> None:
    from recall_tasks.config import RunParams
    from recall_tasks.fleet import rate as fleet
    from recall_tasks.pipeline.flow import recall_benchmark

    params = RunParams(
        dataset_uri=data, output_uri=out, judge="openai", base_url=base_url, requests_per_minute=rpm,
        max_retries=0, chunk_size=100, baseline=None,
    )  # fmt: skip
    t0 = time.perf_counter()
    summary = recall_benchmark(params)
    print(json.dumps({"wall_s": time.perf_counter() - t0, "pid": os.getpid(), "fleet": fleet.process_stats(),
                      "errors": summary["errors"], "scored": summary["scored"]}))  # fmt: skip


def busiest(times: list[float], window: float) -> int:
    return max((bisect.bisect_right(times, t + window) - i for i, t in enumerate(times)), default=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rpm", type=int, default=1200)
    parser.add_argument("--rows", type=int, default=300, help="rows per run (one request each)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", nargs=4, metavar=("DATA", "OUT", "BASE_URL", "RPM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        data, out, base_url, rpm = args.child
        child(data, out, base_url, int(rpm))
        return

    sys.path.insert(0, str(ROOT))
    from tests import judge_script
    from tests.fake_openai import FakeOpenAI
    from tests.test_pipeline import KEY, make_rows, write_parquet

    tmp = Path(tempfile.mkdtemp(prefix="recall-ratelimit-"))
    prefect, api_url = start_prefect_server(tmp / "prefect")
    server = FakeOpenAI(judge_script.responder, rpm_quota=args.rpm).start()
    server.record = False
    env = {
        **os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": api_url, "PREFECT_HOME": str(tmp / "prefect"),
        "OPENAI_API_KEY": KEY, "PREFECT_LOGGING_LEVEL": "WARNING",
    }  # fmt: skip
    try:
        procs = []
        for i in range(args.runs):
            data = write_parquet(tmp / f"d{i}" / "eval.parquet", make_rows(args.rows, seed=100 + i), 100)
            cmd = [sys.executable, "-m", "benchmarks.rate_limit", "--child", data, str(tmp / f"out{i}"),
                   server.base_url, str(args.rpm)]  # fmt: skip
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True))
        results = []
        for proc in procs:
            stdout, _ = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"a run failed ({proc.returncode}):\n{stdout[-3000:]}")
            results.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        server.stop()
        prefect.terminate()
        prefect.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    accepted = server.quota_accepted
    span = accepted[-1] - accepted[0] if len(accepted) > 1 else float("nan")
    allowed = int(args.rpm * server.quota_window_s / 60)
    print(f"{args.runs} runs x {args.rows} rows sharing --rpm {args.rpm} (quota {allowed} per 10 s), "
          f"{os.cpu_count()} cores")  # fmt: skip
    print(f"requests sent {len(server.chat_arrivals)}, 429s received {server.quota_429s}, "
          f"accepted {len(accepted)} in {span:.1f} s")  # fmt: skip
    print(f"achieved {len(accepted) / span * 60:.0f} rpm = {100 * len(accepted) / (args.rpm / 60 * span):.1f} % of "
          f"the quota; busiest 10 s window {busiest(accepted, server.quota_window_s)} of {allowed}")  # fmt: skip
    for r in results:
        for f in r["fleet"]:
            print(f"  pid {r['pid']}: {r['wall_s']:.1f} s, {r['scored']} scored, {r['errors']} errors; "
                  f"{f['acquires']} acquires ({f['granted']} requests granted), {f['denied']} refused, "
                  f"{f['waits']} waits")  # fmt: skip


if __name__ == "__main__":
    main()
