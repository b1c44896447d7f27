"""The start-up floor of a ``recall-bench run``: what its dependencies' imports cost before its first judge request.

    python -m benchmarks.import_floor [--runs 3] [--repeat 5]

Issue 42 asks for the process outside the scoring window to take at most 1.5 s. Before the first request, part of
that time is the imports of the packages the run needs to send it (pyarrow, openai, pydantic...), which nothing of
recall-bench's can defer; this script measures that floor, so the rest is known to be the product's own share.

- ``--runs`` whole ``recall-bench run`` processes (1,000 rows, the fake judge at 200 ms, concurrency 100: the
  harness of ``benchmarks/startup.py``, the local Prefect server started by a first, uncounted run), each with a
  ``sitecustomize`` from a temporary folder that records when each import began (``sys.addaudithook``'s
  ``import`` event, ``time.time()``) and writes the list at exit. Per run: the CPU seconds of the run process at
  its first judge request (``startup.one_run``'s 10 ms poller).
- The third-party top-level packages whose import began before the first request (before the fake judge saw it
  and before Prefect's import began, which the CLI starts once the request is sent): not the standard library,
  not ``recall_tasks``, only names the process really loaded; from the last run.
- ``--repeat`` fresh interpreters import exactly those packages; the median of their CPU (``time.process_time``)
  is the **floor**. The bare interpreter's CPU is printed too, and each package's own import alone (its
  dependencies included, so the column does not add up to the floor).

**Own share** = the median CPU to the first request minus the floor: recall-bench's modules, its checks, the
judge's probe, the plan and the first chunks' prompts. Figures printed with the 1-minute load before each run
(``benchmarks/load.py``: ``loaded`` above 1), never asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import load  # noqa: E402
from benchmarks.startup import bench_setup, one_run  # noqa: E402

#: Written into a temporary folder put first on the run's PYTHONPATH: records each import's start, writes at exit
#: (the CLI leaves through ``sys.exit``: the ``atexit`` handlers run).
RECORDER = """\
import atexit, json, os, sys, time
_started = []
def _hook(event, args):
    if event == "import":
        _started.append((time.time(), args[0]))
sys.addaudithook(_hook)
def _write():
    with open(os.environ["IMPORT_FLOOR_OUT"], "w") as fh:
        json.dump({"started": _started, "loaded": sorted(sys.modules)}, fh)
atexit.register(_write)
"""

#: Fresh interpreter: import the packages given, print the process's CPU seconds.
CHILD = "import importlib, sys, time\nfor n in sys.argv[1:]: importlib.import_module(n)\nprint(time.process_time())"


def packages_before(record: dict, first_request_at: float) -> list[str]:
    """The third-party top-level packages whose import began before the first request: before
    ``first_request_at`` (``time.time()``) and before Prefect's import began (the CLI starts it once the request
    is sent, ahead of the judge seeing it). In the order they began; only those the process had loaded at its
    exit (an import that failed is no cost)."""
    loaded = set(record["loaded"])
    own = {"recall_tasks", "__main__", "sitecustomize"}
    cutoff = min([first_request_at, *(t for t, name in record["started"] if name.split(".")[0] == "prefect")])
    seen: list[str] = []
    for started, name in record["started"]:
        top = name.split(".")[0]
        if started >= cutoff or top in seen or top in own or top.startswith("_"):
            continue
        if top in sys.stdlib_module_names or top not in loaded:
            continue
        seen.append(top)
    return seen


def import_cpu(packages: list[str], repeat: int) -> float:
    """Median CPU seconds of ``repeat`` fresh interpreters importing ``packages`` (none: the bare interpreter)."""
    times = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", CHILD, *packages], capture_output=True, text=True, check=True)
        times.append(float(out.stdout.strip()))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5, help="fresh interpreters per import measurement")
    args = parser.parse_args()

    cpu_to_first: list[float] = []
    loads: list[float] = []
    record: dict = {}
    first_at = 0.0
    with (
        tempfile.TemporaryDirectory(prefix="import-floor-") as hook_dir,
        bench_setup(ROOT, 1000, 0.2, "recall-floor-") as bench,
    ):
        (Path(hook_dir) / "sitecustomize.py").write_text(RECORDER)
        stats_url = bench.base_url.removesuffix("/v1") + "/stats"
        for i in range(args.runs + 1):  # run 0 starts the local Prefect server: not counted
            out = Path(hook_dir) / f"imports-{i}.json"
            env = {**bench.env, "PYTHONPATH": f"{hook_dir}:{ROOT}", "IMPORT_FLOOR_OUT": str(out)}
            cmd = [sys.executable, "-m", "recall_tasks", "run", bench.data, "--output", str(bench.tmp / f"out-{i}"),
                   "--judge", "openai", "--base-url", bench.base_url, "--max-concurrency", "100"]  # fmt: skip
            loads.append(load.load_1min())
            run = one_run(cmd, env, ROOT, stats_url, bench.tmp / f"run-{i}.log")
            first_at = json.loads(urllib.request.urlopen(stats_url, timeout=5).read())["first_request_at"]
            record = json.loads(out.read_text())
            if i == 0:
                loads.pop()
                continue
            if run["cpu_to_first_s"] is not None:
                cpu_to_first.append(run["cpu_to_first_s"])
            print(f"run {i}: load {loads[-1]:.2f}, CPU to first request {run['cpu_to_first_s']} s, "
                  f"first request {run['first_request_s']:.2f} s", flush=True)  # fmt: skip

    packages = packages_before(record, first_at)
    bare = import_cpu([], args.repeat)
    floor = import_cpu(packages, args.repeat)
    alone = sorted(((import_cpu([p], args.repeat) - bare, p) for p in packages), reverse=True)
    to_first = statistics.median(cpu_to_first) if cpu_to_first else float("nan")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    print(f"\nrecall-bench import floor at {commit.stdout.strip() or 'unknown'}: "
          f"{len(packages)} third-party packages imported before the first judge request\n")  # fmt: skip
    print(f"{'bare interpreter CPU':<44} {bare:6.2f} s")
    print(f"{'floor: those packages, fresh interpreter':<44} {floor:6.2f} s")
    print(f"{'CPU to the first request (median of runs)':<44} {to_first:6.2f} s")
    print(f"{'own share (CPU to first request - floor)':<44} {to_first - floor:6.2f} s")
    print("\neach package alone, its dependencies included (above the bare interpreter):")
    for cost, name in alone[:12]:
        print(f"  {name:<24} {cost:6.2f} s")
    print(f"\n{load.summary(loads)}")
    if load.stamp(loads) != "quiet":
        print(load.NOT_FOR_README)


if __name__ == "__main__":
    main()
