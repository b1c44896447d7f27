"""Client CPU per judged row, this checkout against another (``--vs``), run alternately pair by pair.

    python -m benchmarks.cpu_per_row --vs /tmp/base [--pairs 3] [--rows 1000] [--latency 0.2] [--concurrency 100]

``--vs`` is an export of the commit to compare with (``git archive 60987c1 | tar -x -C /tmp/base``): its
``recall_tasks`` runs with this checkout's harness and fake judge (``benchmarks/fake_judge.py``). Each pair runs,
for each checkout in turn (the order swaps every pair), three whole processes:

- **library**: ``a_measure`` + ``asyncio.gather`` over ``--rows`` rows at ``--concurrency`` against the fake judge
  at ``--latency`` (``benchmarks/_cpu_child.py``, after a warm-up of 100 rows): process CPU ms per row, wall s;
- **zero latency**: the same on ``--zero-rows`` rows against a second fake judge answering at once: rows/s of
  one process (wall time: the client's CPU is the limit, the judge's process has the other core);
- **CLI**: ``recall-bench run DATA -o NEW --judge openai --max-concurrency C`` (Parquet -> Prefect -> Delta, the
  local Prefect server a first, uncounted run started): the scoring window (fake judge's first request to its
  last answer) against the ideal (rows / concurrency x latency), the process's CPU within that window per row
  (sampled from /proc every 10 ms), and the whole process's CPU and wall time;
- **CLI, marginal** (``--marginal-rows N``, e.g. 5000): the same command on N rows; the whole process's CPU
  beyond the ``--rows`` run's, per extra row, is what each row costs the CLI once start-up is paid (Python,
  the imports, Prefect's flow run: the same at any size). At 1,000 rows that fixed part is most of the CPU
  inside the scoring window too: Prefect is imported while the head start's chunks are judged.

Each run also reads the fake judge's request count and prompt tokens (characters / 4 of the messages sent):
judge calls and prompt tokens per judged row (the library path's warm-up rows counted with its rows). Before
each run the script waits (up to ``--settle-s``, default 120 s) for the machine's 1-minute load
(``os.getloadavg``), which its own previous run raises, to fall to 1, then reads it and prints it with the run;
a figure with a run behind it that began above 1 is stamped ``loaded`` in the table's last column
(``benchmarks/load.py``), and a line under
the table says loaded figures are not for the README.
Printed: every run, then per measure the medians of both checkouts, their ratio and the stamp. On a shared
machine the ratios of alternating pairs are the comparison, not the absolute figures. Figures printed, never
asserted.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.load import NOT_FOR_README, load_1min, settle, stamp, summary  # noqa: E402
from benchmarks.startup import bench_setup, process_cpu_s  # noqa: E402
from benchmarks.throughput import start_judge  # noqa: E402

CHILD = ROOT / "benchmarks" / "_cpu_child.py"


def _judge_stats(url: str, reset: bool = False) -> dict:
    stats_url = url.removesuffix("/v1") + "/stats" + ("?reset=1" if reset else "")
    return dict(json.loads(urllib.request.urlopen(stats_url, timeout=5).read()))


def library(env: dict[str, str], code: Path, data: str, url: str, concurrency: int, settle_s: float = 0.0) -> dict:
    """One library-path process (``_cpu_child.py``) on ``code``'s ``recall_tasks``; its JSON line, the judge's
    requests and prompt tokens, and the load before it."""
    cmd = [sys.executable, str(CHILD), data, url, "--concurrency", str(concurrency)]
    _judge_stats(url, reset=True)
    load = settle(settle_s)
    proc = subprocess.run(cmd, cwd=code, env={**env, "PYTHONPATH": str(code)}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"library run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    stats = _judge_stats(url)
    out = dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {**out, "requests": stats["requests"], "prompt_tokens": stats["prompt_tokens"], "load_1min": load}


def _sample(pid: int, samples: list[tuple[float, float]], done: threading.Event) -> None:
    while not done.is_set():
        cpu = process_cpu_s(pid)
        if cpu is None:
            return
        samples.append((time.time(), cpu))
        time.sleep(0.01)


def _cpu_at(samples: list[tuple[float, float]], at: float) -> float:
    i = bisect.bisect_left(samples, (at, -1.0))
    return samples[min(i, len(samples) - 1)][1]


def cli(
    env: dict[str, str], code: Path, data: str, out: str, url: str, concurrency: int, rows: int, settle_s: float = 0.0
) -> dict:
    """One ``recall-bench run`` process on ``code``: scoring window, CPU within it, whole-process CPU and wall, the
    judge's requests and prompt tokens, the load before it."""
    stats_url = url.removesuffix("/v1") + "/stats"
    urllib.request.urlopen(stats_url + "?reset=1", timeout=5).read()
    load = settle(settle_s)
    cmd = [sys.executable, "-m", "recall_tasks", "run", data, "--output", out, "--judge", "openai",
           "--base-url", url, "--max-concurrency", str(concurrency)]  # fmt: skip
    samples: list[tuple[float, float]] = []
    done = threading.Event()
    w0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=code, env={**env, "PYTHONPATH": str(code)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)  # fmt: skip
    sampler = threading.Thread(target=_sample, args=(proc.pid, samples, done), daemon=True)
    sampler.start()
    output = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - w0
    done.set()
    sampler.join(5)
    stats = json.loads(urllib.request.urlopen(stats_url, timeout=5).read())
    code_ = os.waitstatus_to_exitcode(status)
    if code_ != 0 or stats["requests"] != rows:
        raise RuntimeError(f"run failed ({code_}, {stats['requests']} requests):\n{output.decode()[-3000:]}")
    first, last = stats["first_request_at"], stats["last_response_at"]
    return {
        "window_s": last - first,
        "scoring_cpu_s": _cpu_at(samples, last) - _cpu_at(samples, first),
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "wall_s": wall,
        "rows": rows,
        "requests": stats["requests"],
        "prompt_tokens": stats["prompt_tokens"],
        "load_1min": load,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vs", type=Path, required=True, help="the other checkout (an export of the base commit)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--zero-rows", type=int, default=3000)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--marginal-rows", type=int, default=0, help="also run the CLI on this many rows (see above)")
    parser.add_argument("--settle-s", type=float, default=120.0,
                        help="before each run, wait up to this long for the 1-minute load to fall to 1")  # fmt: skip
    parser.add_argument("--only", nargs="+", choices=("library", "zero", "cli"), default=("library", "zero", "cli"))
    args = parser.parse_args()

    checkouts = {"this": ROOT, "base": args.vs.resolve()}
    runs: list[tuple[str, str, dict]] = []  # (measure, checkout, figures)
    with bench_setup(ROOT, max(args.rows, args.zero_rows, args.marginal_rows), args.latency, "recall-cpu-") as bench:
        (bench.tmp / "zero").mkdir()
        zero, zero_url = start_judge(0.0, bench.tmp / "zero")
        try:
            import pyarrow.parquet as pq

            full = pq.read_table(bench.data)
            data = str(bench.tmp / "rows.parquet")
            pq.write_table(full.slice(0, args.rows), data)
            zero_data = str(bench.tmp / "zero.parquet")
            pq.write_table(full.slice(0, args.zero_rows), zero_data)
            large_data = str(bench.tmp / "large.parquet")
            if args.marginal_rows:
                pq.write_table(full.slice(0, args.marginal_rows), large_data)
            if "cli" in args.only:  # starts the local Prefect server both checkouts then use
                cli(bench.env, ROOT, data, str(bench.tmp / "out-cold"), bench.base_url, args.concurrency, args.rows)
            for pair in range(args.pairs):
                order = ["this", "base"] if pair % 2 == 0 else ["base", "this"]
                for name in order:
                    code = checkouts[name]
                    start = len(runs)
                    print(f"pair {pair + 1} {name}: 1-minute load before its runs {load_1min():.2f}", flush=True)
                    if "library" in args.only:
                        r = library(bench.env, code, data, bench.base_url, args.concurrency, args.settle_s)
                        runs.append(("library", name, r))
                    if "zero" in args.only:
                        r = library(bench.env, code, zero_data, zero_url, args.concurrency, args.settle_s)
                        runs.append(("zero", name, r))
                    if "cli" in args.only:
                        out = str(bench.tmp / f"out-{name}-{pair}")
                        r = cli(bench.env, code, data, out, bench.base_url, args.concurrency, args.rows, args.settle_s)
                        runs.append(("cli", name, r))
                    if "cli" in args.only and args.marginal_rows:
                        out = str(bench.tmp / f"out-{name}-{pair}-large")
                        r = cli(
                            bench.env, code, large_data, out, bench.base_url, args.concurrency, args.marginal_rows,
                            args.settle_s,
                        )  # fmt: skip
                        runs.append(("cli_large", name, r))
                    print(f"pair {pair + 1} {name}: " + "; ".join(
                        f"{m} {json.dumps(r)}" for m, _, r in runs[start:]), flush=True)  # fmt: skip
        finally:
            zero.terminate()
            zero.wait(10)

    ideal = args.rows / args.concurrency * args.latency
    marginal: dict[str, float] = {}
    measures = {
        "library CPU ms/row": ("library", lambda r: 1000 * r["cpu_s"] / r["rows"]),
        "library wall s": ("library", lambda r: r["wall_s"]),
        "zero-latency rows/s": ("zero", lambda r: r["rows"] / r["wall_s"]),
        "zero-latency CPU ms/row": ("zero", lambda r: 1000 * r["cpu_s"] / r["rows"]),
        "library judge calls/row": ("library", lambda r: r["requests"] / (r["rows"] + r["warm"])),
        "library prompt tokens/row": ("library", lambda r: r["prompt_tokens"] / (r["rows"] + r["warm"])),
        "CLI CPU ms/row while scoring": ("cli", lambda r: 1000 * r["scoring_cpu_s"] / args.rows),
        f"CLI scoring window s (ideal {ideal:.1f})": ("cli", lambda r: r["window_s"]),
        "CLI window / ideal": ("cli", lambda r: r["window_s"] / ideal),
        "CLI whole-process CPU s": ("cli", lambda r: r["cpu_s"]),
        "CLI whole-process wall s": ("cli", lambda r: r["wall_s"]),
        "CLI judge calls/row": ("cli", lambda r: r["requests"] / r["rows"]),
        "CLI prompt tokens/row": ("cli", lambda r: r["prompt_tokens"] / r["rows"]),
        f"CLI {args.marginal_rows:,} rows: whole-process CPU s": ("cli_large", lambda r: r["cpu_s"]),
    }
    print(
        f"\nclient CPU per row: {args.rows} rows, judge latency {args.latency * 1000:.0f} ms, concurrency "
        f"{args.concurrency}; zero latency: {args.zero_rows} rows; this = {ROOT}, base = {checkouts['base']}\n"
    )
    header = f"{'measure':<38} {'pairs (this / base)':<44} {'this':>8} {'base':>8} {'this/base':>9} {'load':>7}"
    print(header)
    print("-" * len(header))
    for label, (kind, value) in measures.items():
        this = [value(r) for m, n, r in runs if m == kind and n == "this"]
        base = [value(r) for m, n, r in runs if m == kind and n == "base"]
        if not this or not base:
            continue
        pairs = " ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(this, base, strict=False))
        mt, mb = statistics.median(this), statistics.median(base)
        loaded = stamp(r["load_1min"] for m, _, r in runs if m == kind)
        print(f"{label:<38} {pairs:<44} {mt:>8.2f} {mb:>8.2f} {mt / mb:>9.2f} {loaded:>7}")
    if args.marginal_rows:
        extra = args.marginal_rows - args.rows
        for name in ("this", "base"):
            small = statistics.median(r["cpu_s"] for m, n, r in runs if m == "cli" and n == name)
            large = statistics.median(r["cpu_s"] for m, n, r in runs if m == "cli_large" and n == name)
            marginal[name] = 1000 * (large - small) / extra
        loaded = stamp(r["load_1min"] for m, _, r in runs if m in ("cli", "cli_large"))
        print(f"{'CLI marginal CPU ms/row (medians)':<38} {'':<44} {marginal['this']:>8.2f} {marginal['base']:>8.2f} "
              f"{marginal['this'] / marginal['base']:>9.2f} {loaded:>7}")  # fmt: skip
    digests = {(n, r["scores"]) for m, n, r in runs if m in ("library", "zero")}
    print(f"\nscore digests (library path; one per dataset and checkout): {sorted(digests)}")
    loads = [r["load_1min"] for _, _, r in runs]
    print(summary(loads))
    if stamp(loads) == "loaded":
        print(NOT_FOR_README)


if __name__ == "__main__":
    main()
