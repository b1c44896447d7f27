"""Whole processes on the same rows: ``recall-bench run`` against ragas 0.4.3 in its own venv, pair by pair.

    python -m benchmarks.vs_ragas [--pairs 3] [--rows 1000] [--latency 0.2] [--concurrency 100] [--venv DIR]
                                  [--ragas-api evaluate|ascore]

ragas runs in a separate venv (default ``~/.cache/recall-bench/ragas-0.4.3``), made on first use with
``python -m venv`` and installed from PyPI with ``benchmarks/ragas_requirements.txt`` (every package pinned;
remade when that file changes; the versions that matter are printed). Both tools score the same Parquet file
(``benchmarks/throughput.py``'s rows, ragas' column names ``user_input``/``reference``/``retrieved_contexts``)
against the same fake judge (``benchmarks/fake_judge.py``, fixed latency, which answers both tools' prompts with
every statement supported, so every row scores 1.0 in both):

- **ragas**: ``benchmarks/_ragas_child.py`` with the venv's Python: ``evaluate()`` with ``LLMContextRecall`` on
  ``llm_factory(model, client=AsyncOpenAI(base_url=...))`` and ``RunConfig(max_workers=CONCURRENCY)``, scores
  read back from the result (``RAGAS_DO_NOT_TRACK=true``: its usage analytics would post to the internet);
  ``--ragas-api ascore``: the metric's async API instead (``metrics.collections.ContextRecall.ascore`` per row
  under ``asyncio.gather``, CONCURRENCY at a time), ragas' leanest path;
- **recall-bench**: ``python -m recall_tasks run DATA --output NEW --judge openai --base-url URL
  --max-concurrency CONCURRENCY`` with this checkout (Parquet -> Prefect -> Delta; the local Prefect server is
  started by a first, uncounted run, as a user's second run finds it; ragas gets an uncounted first run too).

The pairs alternate (the order swaps every pair). Each process is timed from exec to exit (wall, and CPU from
``os.wait4``: the process and the children it waited for; recall-bench's local Prefect server is not its child,
so its CPU during the run, read from /proc, is added in a row of its own); the fake judge gives the requests
made, the time to the first request and the scoring window (first request to last answer). Every run must score
every row (a run that does not stops the benchmark); the rows scored are read back from each tool's own output.
The fake judge also gives each run's judge calls and prompt tokens (characters / 4 of the messages it was sent),
printed per row. Before each run the script waits (up to ``--settle-s``, default 120 s) for the machine's
1-minute load (``os.getloadavg``), which its own previous run raises, to fall to 1, then reads and prints it; a run that
began above 1 is ``loaded``, and so is every figure with such a run behind it (``benchmarks/load.py``): the
table's last column says ``loaded`` or ``quiet``, and a line under it says that loaded figures are not for the
README. Printed: every run with its load, then per measure both medians, their ratio ragas / recall-bench, the
median of the pairs' own ratios and the stamp. Figures printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.load import NOT_FOR_README, settle, stamp, summary  # noqa: E402
from benchmarks.startup import Bench, bench_setup, group_cpu_s, one_run, server_pid  # noqa: E402

REQUIREMENTS = ROOT / "benchmarks" / "ragas_requirements.txt"
CHILD = ROOT / "benchmarks" / "_ragas_child.py"
DEFAULT_VENV = Path.home() / ".cache" / "recall-bench" / "ragas-0.4.3"
#: the packages on ragas' path to the judge whose versions are printed (all are pinned in REQUIREMENTS)
SHOWN = ("ragas", "openai", "instructor", "langchain-core", "langchain-community", "pydantic", "httpx", "numpy")


def ragas_venv(venv: Path) -> Path:
    """The Python of a venv holding exactly ``REQUIREMENTS``; made (or remade) with pip when it does not."""
    python = venv / "bin" / "python"
    installed = venv / "installed-requirements.txt"
    wanted = REQUIREMENTS.read_text()
    if python.exists() and installed.exists() and installed.read_text() == wanted:
        return python
    print(f"installing ragas' environment into {venv} (a few minutes) ...", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    # --no-deps: the file is a complete freeze, so nothing is resolved again; pip check proves it is complete
    subprocess.run([*pip, "install", "--quiet", "--no-deps", "-r", str(REQUIREMENTS)], check=True)
    subprocess.run([*pip, "check"], check=True)
    installed.write_text(wanted)
    return python


def versions(python: Path) -> str:
    code = (
        "import importlib.metadata as m, platform; "
        f"print(', '.join(f'{{n}} {{m.version(n)}}' for n in {SHOWN!r}), '| Python', platform.python_version())"
    )
    return subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout.strip()


def _window(stats_url: str, run: dict) -> dict:
    stats = json.loads(urllib.request.urlopen(stats_url, timeout=5).read())
    return {**run, "window_s": stats["last_response_at"] - stats["first_request_at"]}


def run_ragas(bench: Bench, python: Path, data: str, concurrency: int, api: str, log: Path) -> dict:
    """One whole ragas process on ``data``; its figures and the rows it scored (from its own result)."""
    stats_url = bench.base_url.removesuffix("/v1") + "/stats"
    env = {k: v for k, v in bench.env.items() if k != "PYTHONPATH"}
    env["RAGAS_DO_NOT_TRACK"] = "true"
    cmd = [str(python), str(CHILD), data, bench.base_url, "--workers", str(concurrency), "--api", api]
    run = _window(stats_url, one_run(cmd, env, bench.tmp, stats_url, log))
    run["server_cpu_s"] = 0.0  # ragas has no server
    lines = [line for line in log.read_text().splitlines() if line.startswith('{"rows"')]
    if not lines:
        raise RuntimeError(f"ragas printed no result:\n{log.read_text()[-3000:]}")
    out = json.loads(lines[-1])
    return {**run, "rows": out["rows"], "scored": out["scored"], "mean": out["mean"]}


def run_recall_bench(bench: Bench, data: str, out: Path, concurrency: int, log: Path) -> dict:
    """One whole ``recall-bench run`` process on ``data``; its figures and the rows scored in its results table."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    stats_url = bench.base_url.removesuffix("/v1") + "/stats"
    cmd = [sys.executable, "-m", "recall_tasks", "run", data, "--output", str(out), "--judge", "openai",
           "--base-url", bench.base_url, "--max-concurrency", str(concurrency)]  # fmt: skip
    server = server_pid(bench.tmp / "state")  # None before the first run starts it
    server_cpu = group_cpu_s(server) if server else 0.0
    run = _window(stats_url, one_run(cmd, bench.env, ROOT, stats_url, log))
    server = server or server_pid(bench.tmp / "state")
    run["server_cpu_s"] = group_cpu_s(server) - server_cpu if server else 0.0
    table = DeltaTable(str(out / "results")).to_pyarrow_table(columns=["score", "error"])
    ok = pc.and_(pc.is_valid(table["score"]), pc.is_null(table["error"]))
    scores = table.filter(ok)["score"]
    mean = pc.mean(scores).as_py() if len(scores) else None
    return {**run, "rows": table.num_rows, "scored": len(scores), "mean": mean}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="ragas' venv (made if missing or stale)")
    parser.add_argument("--ragas-api", choices=("evaluate", "ascore"), default="evaluate")
    parser.add_argument("--settle-s", type=float, default=120.0,
                        help="before each run, wait up to this long for the 1-minute load to fall to 1")  # fmt: skip
    args = parser.parse_args()

    python = ragas_venv(args.venv.expanduser())
    ragas_versions = versions(python)
    runs: list[tuple[str, dict]] = []
    with bench_setup(ROOT, args.rows, args.latency, "recall-vs-ragas-") as bench:
        logs = bench.tmp / "logs"
        logs.mkdir()
        # uncounted: recall-bench's first run starts the local Prefect server; ragas' first reads its venv from disk
        run_recall_bench(bench, bench.data, bench.tmp / "out-first", args.concurrency, logs / "recall-bench-first")
        run_ragas(bench, python, bench.data, args.concurrency, args.ragas_api, logs / "ragas-first")
        for pair in range(args.pairs):
            order = ["recall-bench", "ragas"] if pair % 2 == 0 else ["ragas", "recall-bench"]
            for name in order:
                log = logs / f"{name}-{pair}"
                load = settle(args.settle_s)
                print(f"pair {pair + 1} {name}: 1-minute load before the run {load:.2f}", flush=True)
                if name == "ragas":
                    r = run_ragas(bench, python, bench.data, args.concurrency, args.ragas_api, log)
                else:
                    r = run_recall_bench(bench, bench.data, bench.tmp / f"out-{pair}", args.concurrency, log)
                if r["scored"] != args.rows or r["rows"] != args.rows:
                    raise RuntimeError(f"{name} scored {r['scored']} of {r['rows']} rows ({args.rows} given):\n"
                                       f"{log.read_text()[-3000:]}")  # fmt: skip
                runs.append((name, {**r, "cpu_all_s": r["cpu_s"] + r["server_cpu_s"], "load_1min": load}))
                print(f"pair {pair + 1} {name}: {json.dumps({k: v for k, v in r.items() if v is not None})}",
                      flush=True)  # fmt: skip

    ideal = args.rows / args.concurrency * args.latency
    print(
        f"\nwhole processes, {args.rows} rows, judge latency {args.latency * 1000:.0f} ms, concurrency "
        f"{args.concurrency}, {args.pairs} pairs (order swapped each pair); ideal scoring window {ideal:.1f} s\n"
        f"recall-bench: {ROOT} (Python {platform.python_version()})\n"
        f"ragas ({args.ragas_api}), venv {python.parents[1]}: {ragas_versions}\n"
    )
    measures: dict[str, Callable[[dict], float]] = {
        "wall s (exec to exit)": lambda r: r["wall_s"],
        "CPU s (user+sys)": lambda r: r["cpu_s"],
        "CPU s + Prefect server's": lambda r: r["cpu_all_s"],
        "first judge request s": lambda r: r["first_request_s"],
        "scoring window s": lambda r: r["window_s"],
        "judge calls per row": lambda r: r["requests"] / r["rows"],
        "prompt tokens per row": lambda r: r["prompt_tokens"] / r["rows"],
        "rows scored": lambda r: r["scored"],
    }
    header = (
        f"{'measure':<24} {'pairs (ragas / recall-bench)':<44} {'ragas':>8} {'recall-b.':>9} {'ratio':>6} "
        f"{'pair ratios':>11} {'load':>7}"
    )
    print(header)
    print("-" * len(header))
    loads = [r["load_1min"] for _, r in runs]
    for label, value in measures.items():
        ragas = [float(value(r)) for n, r in runs if n == "ragas"]
        ours = [float(value(r)) for n, r in runs if n == "recall-bench"]
        pairs = " ".join(
            f"{a:.2f}/{b:.2f}" if a < 100 else f"{a:.0f}/{b:.0f}" for a, b in zip(ragas, ours, strict=True)
        )
        mr, mo = statistics.median(ragas), statistics.median(ours)
        by_pair = statistics.median(a / b for a, b in zip(ragas, ours, strict=True))
        print(f"{label:<24} {pairs:<44} {mr:>8.2f} {mo:>9.2f} {mr / mo:>6.2f} {by_pair:>11.2f} {stamp(loads):>7}")
    means = sorted({(n, r["mean"]) for n, r in runs})
    print(
        "\nratio = ragas median / recall-bench median; pair ratios = median of each pair's ragas / recall-bench "
        f"(pair i: the i-th run of each); mean score per tool and run: {means}\n{summary(loads)}"
    )
    if stamp(loads) == "loaded":
        print(NOT_FOR_README)


if __name__ == "__main__":
    main()
