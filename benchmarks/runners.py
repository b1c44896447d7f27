"""Task runners compared: rows/s and client CPU per row for threads, processes and Dask against the fake judge.

    python benchmarks/runners.py [--rows 20000] [--latency 0.05] [--in-flight 400] [--workers 2]

The harness of ``benchmarks/throughput.py``: a real Prefect server and ``benchmarks/fake_judge.py`` in their own
processes, ragas-like rows, each phase in a fresh process (``benchmarks/run_phase.py``). The judge answers after
``--latency`` s with unlimited concurrency, so at 400 requests in flight the client is CPU-bound. Each runner keeps
``--in-flight`` requests in flight in total: threads one process with ``--max-concurrency`` 400; processes and
Dask ``--workers`` processes with 400 / workers each. Every phase writes to its own output (no cache shared).

Client CPU is the whole process tree of a phase (the flow process and its worker processes, reaped when the
runner stops), start-up and imports included: ~2 s per process, which dominates short runs; ``flow CPU`` is the
flow process alone. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.throughput import ROOT, make_table, start_judge, start_prefect_server, write_dataset


def tree_cpu() -> float:
    """CPU seconds of every reaped descendant so far (a phase's process and the workers it reaped)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def phase(env: dict[str, str], data: str, out: str, base_url: str, runner: str, workers: int, in_flight: int) -> dict:
    conc = in_flight if runner == "threads" else max(1, in_flight // workers)
    cmd = [sys.executable, "-m", "benchmarks.run_phase", data, out, "--base-url", base_url,
           "--concurrency", str(conc), "--task-runner", runner]  # fmt: skip
    if runner != "threads":
        cmd += ["--runner-workers", str(workers)]
    urllib.request.urlopen(base_url.removesuffix("/v1") + "/stats?reset=1", timeout=5).read()
    cpu0, wall0 = tree_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    cpu, wall = tree_cpu() - cpu0, time.perf_counter() - wall0
    if proc.returncode != 0:
        raise RuntimeError(f"{runner} phase failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    stats = json.loads(urllib.request.urlopen(base_url.removesuffix("/v1") + "/stats", timeout=5).read())
    result.update(tree_cpu_s=cpu, command_wall_s=wall, peak_in_flight=stats["peak_in_flight"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--in-flight", type=int, default=400)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runners", nargs="+", default=["threads", "processes", "dask"])
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="recall-runners-"))
    prefect, api_url = start_prefect_server(tmp / "prefect")
    judge, base_url = start_judge(args.latency, tmp)
    env = {
        **os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": api_url, "PREFECT_HOME": str(tmp / "prefect"),
        "OPENAI_API_KEY": "sk-bench", "PREFECT_LOGGING_LEVEL": "WARNING",
    }  # fmt: skip
    rows: list[tuple[str, dict]] = []
    try:
        data = write_dataset(tmp / "data" / "bench.parquet", make_table(args.rows))
        for runner in args.runners:
            rows.append((runner, phase(env, data, str(tmp / f"out-{runner}"), base_url, runner, args.workers,
                                       args.in_flight)))  # fmt: skip
    finally:
        for proc in (judge, prefect):
            proc.terminate()
            proc.wait(timeout=30)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    threads = next((r for name, r in rows if name == "threads"), None)
    print(f"{args.rows} rows, judge latency {args.latency * 1000:.0f} ms, {args.in_flight} in flight, "
          f"{os.cpu_count()} cores")  # fmt: skip
    print(f"{'runner':<22} {'rows/s':>8} {'ratio':>6} {'CPU ms/row':>11} {'flow CPU ms/row':>16} {'peak':>5}")
    for name, r in rows:
        label = name if name == "threads" else f"{name} ({args.workers} workers)"
        rate = r["rows"] / r["wall_s"]
        ratio = rate / (threads["rows"] / threads["wall_s"]) if threads else float("nan")
        print(f"{label:<22} {rate:>8.0f} {ratio:>6.2f} {1000 * r['tree_cpu_s'] / r['rows']:>11.2f} "
              f"{1000 * r['cpu_s'] / r['rows']:>16.2f} {r['peak_in_flight']:>5}")  # fmt: skip
        if r["scored"] != r["rows"] or r["errors"]:
            print(f"  {name}: {r['scored']} of {r['rows']} scored, {r['errors']} errors")


if __name__ == "__main__":
    main()
