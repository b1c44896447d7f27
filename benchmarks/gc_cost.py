"""What garbage collection costs a ``recall-bench run`` process: collections and seconds per generation, and the
interpreter's shutdown after the last line printed.

    python benchmarks/gc_cost.py [--rows 1000] [--runs 3] [--latency 0.2] [--chunk-size N] [--code-dir DIR] [--vs DIR]

Each run is ``python -c <wrapper> run DATA -o NEW_OUTPUT --judge openai`` against the fake judge
(``benchmarks/fake_judge.py``, ``--latency`` seconds a reply; 0 makes the run CPU-bound, where a run's own
collections show: the thresholds ``cli.app.settle_process`` sets) and the local Prefect server the first run
starts (a temporary state directory, as ``benchmarks/startup.py``). The wrapper counts every collection with
``gc.callbacks`` (its generation and duration), notes the collections made before the first judge request, and
registers a first ``atexit`` handler (so the last to run) that prints the time; the harness takes the process's
end from ``os.wait4``. ``--vs DIR`` alternates runs of another checkout (``git archive`` of an older commit) with
``--code-dir``'s, on the same server. Figures printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.startup import alternate, bench_setup  # noqa: E402

WRAPPER = """
import atexit, gc, json, sys, time
stats = {"n": [0, 0, 0], "s": [0.0, 0.0, 0.0], "before_first": None}
began = []
def watch(phase, info):
    if phase == "start":
        began.append(time.perf_counter())
    elif began:
        g = info["generation"]
        stats["n"][g] += 1
        stats["s"][g] += time.perf_counter() - began.pop()
gc.callbacks.append(watch)
def last():
    stats["atexit_at"] = time.time()
    print("GC-STATS " + json.dumps(stats), file=sys.__stderr__, flush=True)
atexit.register(last)
import recall_tasks.fleet.guards as guards
sent = guards.CircuitBreaker.attempt_sent
def first(self):
    if stats["before_first"] is None:
        stats["before_first"] = {"n": list(stats["n"]), "s": list(stats["s"])}
    return sent(self)
guards.CircuitBreaker.attempt_sent = first
from recall_tasks.cli.app import console_main
sys.argv = ["recall-bench"] + sys.argv[1:]
console_main()
"""


def one_run(cmd: list[str], env: dict[str, str], cwd: Path, log: Path) -> dict:
    with open(log, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=out)
        _, status, usage = os.wait4(proc.pid, 0)
        ended = time.time()
        wall = time.perf_counter() - t0
    text = log.read_text()
    line = next((x for x in text.splitlines() if x.startswith("GC-STATS ")), None)
    if os.waitstatus_to_exitcode(status) != 0 or line is None:
        raise RuntimeError(f"run failed ({os.waitstatus_to_exitcode(status)}):\n{text[-3000:]}")
    stats = json.loads(line.removeprefix("GC-STATS "))
    return {
        "gc_s": sum(stats["s"]),
        "by_gen": stats["s"],
        "count": stats["n"],
        "before_first_s": sum((stats["before_first"] or {"s": [0.0]})["s"]),
        "shutdown_s": ended - stats["atexit_at"],
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3, help="warm runs per checkout, after one cold run")
    parser.add_argument("--latency", type=float, default=0.2, help="the fake judge's seconds a reply")
    parser.add_argument("--chunk-size", type=int, default=None, help="the run's --chunk-size (default: the CLI's)")
    parser.add_argument("--code-dir", type=Path, default=ROOT)
    parser.add_argument("--vs", type=Path, default=None)
    args = parser.parse_args()

    code_dir = args.code_dir.resolve()
    results: list[tuple[str, dict]] = []
    with bench_setup(code_dir, args.rows, args.latency, "recall-gc-") as bench:
        for name, where, i in alternate(code_dir, args.vs, args.runs):
            tag = f"{name.replace(' ', '-')}{i}"
            cmd = [sys.executable, "-c", WRAPPER, "run", bench.data, "--output", str(bench.tmp / f"out-{tag}"),
                   "--judge", "openai", "--base-url", bench.base_url, "--max-concurrency", "100"]  # fmt: skip
            if args.chunk_size:
                cmd += ["--chunk-size", str(args.chunk_size)]
            results.append(
                (name, one_run(cmd, {**bench.env, "PYTHONPATH": str(where)}, where, bench.tmp / f"{tag}.log"))
            )

    print(f"\ngarbage collection in recall-bench run: {args.rows} rows, judge latency {args.latency} s, "
          f"chunk size {args.chunk_size or 'default'}, "
          f"code {args.code_dir.resolve()}"
          + (f", alternating with vs {args.vs.resolve()}" if args.vs else "") + "\n")  # fmt: skip
    header = (
        f"{'run':<10} {'GC s':>6} {'gen0/1/2 s':>18} {'collections':>16} {'GC before 1st req s':>20} "
        f"{'shutdown s':>11} {'wall s':>7} {'CPU s':>6}"
    )
    print(header)
    print("-" * len(header))
    for name, r in results:
        gens = "/".join(f"{s:.2f}" for s in r["by_gen"])
        counts = "/".join(map(str, r["count"]))
        print(f"{name:<10} {r['gc_s']:>6.2f} {gens:>18} {counts:>16} {r['before_first_s']:>20.2f} "
              f"{r['shutdown_s']:>11.2f} {r['wall_s']:>7.2f} {r['cpu_s']:>6.2f}")  # fmt: skip
    for prefix in ("", "vs "):
        warm = [r for n, r in results if n == prefix + "warm"]
        if warm:
            med = {k: statistics.median(r[k] for r in warm) for k in ("gc_s", "before_first_s", "shutdown_s",
                                                                      "wall_s", "cpu_s")}  # fmt: skip
            print(f"{prefix + 'warm median':<16} GC {med['gc_s']:.2f} s, before the first request "
                  f"{med['before_first_s']:.2f} s, shutdown {med['shutdown_s']:.2f} s, wall {med['wall_s']:.2f} s, "
                  f"CPU {med['cpu_s']:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
