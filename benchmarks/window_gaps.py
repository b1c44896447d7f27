"""Where a ``recall-bench run``'s scoring window loses time against the ideal (rows / concurrency x latency).

    python -m benchmarks.window_gaps [--runs 3] [--rows 1000] [--latency 0.2] [--concurrency 100] [--py-spy FILE]

Whole ``recall-bench run`` processes (as ``benchmarks/vs_ragas.py`` runs them: the local Prefect server started by
a first, uncounted run) against the fake judge (``benchmarks/fake_judge.py``), which records when each request
arrived and when its answer left (``GET /timeline``). A client that refills every slot at once would send request
``i + concurrency`` when answer ``i`` leaves; per run this prints:

- the window (first request to last answer) against the ideal, and the 1-minute load before the run;
- **ramp**: from the first request to the ``concurrency``-th (a full window of requests out);
- **refill lag**: request ``i + concurrency``'s arrival minus answer ``i``'s departure (sorted), its median, 90th
  percentile and sum / concurrency (the time the slots lost, as window seconds);
- **tail**: from the last request's arrival to the last answer (at least the latency);
- the largest gaps between consecutive arrivals, at their offset into the window (a chunk boundary, a commit or
  a pause of the event loop shows as one).

``--py-spy FILE``: ``py-spy record`` (from PyPI, into the venv) attaches to the last run at its first judge
request and samples for ``--spy-seconds``: only the thread holding the GIL (``--gil``), per thread (``--threads``),
into FILE (``--format raw``: one folded stack a line; fold it with any flame graph tool). Its sampling takes CPU
from the run (on one core, the window stretches): read its shares, not the window of that run.
Every run prints the 1-minute load before it. Figures printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.load import load_1min  # noqa: E402
from benchmarks.startup import bench_setup, one_run  # noqa: E402


def analyse(arrived: list[float], answered: list[float], concurrency: int, latency: float) -> dict:
    """The window's decomposition (see the module docstring) from the judge's timeline."""
    arrived, answered = sorted(arrived), sorted(answered)
    t0 = arrived[0]
    n = len(arrived)
    c = min(concurrency, n)
    lags = [arrived[i] - answered[i - c] for i in range(c, n)]
    gaps = sorted(((b - a, a - t0) for a, b in zip(arrived, arrived[1:], strict=False)), reverse=True)[:5]
    return {
        "requests": n,
        "window_s": answered[-1] - t0,
        "ideal_s": n / concurrency * latency,
        "ramp_s": arrived[c - 1] - t0,
        "lag_median_ms": 1000 * statistics.median(lags) if lags else 0.0,
        "lag_p90_ms": 1000 * sorted(lags)[int(0.9 * len(lags))] if lags else 0.0,
        "lag_sum_per_slot_s": sum(lags) / c,
        "tail_s": answered[-1] - arrived[-1],
        "largest_gaps": [(round(1000 * g), round(at, 3)) for g, at in gaps],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--py-spy", type=Path, default=None, help="sample the last run's window with py-spy")
    parser.add_argument("--spy-seconds", type=int, default=3)
    args = parser.parse_args()

    with bench_setup(ROOT, args.rows, args.latency, "recall-gaps-") as bench:
        stats_url = bench.base_url.removesuffix("/v1") + "/stats"
        timeline_url = bench.base_url.removesuffix("/v1") + "/timeline"
        for i in range(args.runs + 1):  # run 0 starts the local Prefect server: not counted
            cmd = [sys.executable, "-m", "recall_tasks", "run", bench.data, "--output", str(bench.tmp / f"out-{i}"),
                   "--judge", "openai", "--base-url", bench.base_url, "--max-concurrency",
                   str(args.concurrency)]  # fmt: skip
            urllib.request.urlopen(timeline_url + "?reset=1", timeout=5).read()
            load = load_1min()
            if args.py_spy and i == args.runs:
                run = spied(cmd, bench.env, stats_url, args.py_spy, args.spy_seconds)
            else:
                run = one_run(cmd, bench.env, ROOT, stats_url, bench.tmp / f"run-{i}.log")
            timeline = json.loads(urllib.request.urlopen(timeline_url, timeout=5).read())
            if i == 0:
                continue
            figures = analyse(timeline["arrived"], timeline["answered"], args.concurrency, args.latency)
            figures["window_over_ideal"] = figures["window_s"] / figures["ideal_s"]
            print(json.dumps({"run": i, "load_1min": round(load, 2), **{k: round(v, 3) if isinstance(v, float) else v
                                                                         for k, v in {**run, **figures}.items()}}),
                  flush=True)  # fmt: skip


def spied(cmd: list[str], env: dict[str, str], stats_url: str, out: Path, seconds: int) -> dict:
    """One run with ``py-spy record`` attached from its first judge request for ``seconds``; its wall time."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    urllib.request.urlopen(stats_url + "?reset=1", timeout=5).read()
    w0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    recorder = None
    while proc.poll() is None:
        if recorder is None and json.loads(urllib.request.urlopen(stats_url, timeout=5).read())["first_request_at"]:
            recorder = subprocess.Popen([spy, "record", "--pid", str(proc.pid), "--gil", "--threads", "--nonblocking",
                                         "--rate", "200", "--format", "raw", "--duration", str(seconds), "-o",
                                         str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
        time.sleep(0.01)
    if recorder is not None:
        _, spy_err = recorder.communicate()
        if not out.exists():
            raise RuntimeError(f"py-spy wrote no profile: {spy_err.decode()[-2000:]}")
    if proc.returncode != 0:
        raise RuntimeError(f"run failed ({proc.returncode})")
    return {"wall_s": time.perf_counter() - w0}


if __name__ == "__main__":
    main()
