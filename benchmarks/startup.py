"""Start-up benchmark: a whole ``recall-bench run`` process on 1,000 rows, from the command's start to its exit.

    python benchmarks/startup.py [--rows 1000] [--latency 0.2] [--concurrency 100] [--warm 3] [--code-dir DIR]

Measures what a person tuning a retriever waits for, the process's start-up included (the throughput benchmark
times the flow alone). Against the fake judge (``benchmarks/fake_judge.py``, fixed latency, which records the
arrival time of its first request), each run is ``python -m recall_tasks run DATA -o NEW_OUTPUT --judge openai``
in a fresh process with no ``PREFECT_API_URL``, as a user would type it:

- **cold**: the first run with an empty recall-bench state directory (no local Prefect server yet);
- **warm**: the next ``--warm`` runs (the server the first run left is reused).

Each run writes to a new output folder, so every run judges every row (no cache hits). The runs write bytecode
(``PYTHONDONTWRITEBYTECODE`` is not passed on): the cold run compiles recall-bench's modules, the warm runs read
them from ``__pycache__``, as a user's repeated runs do. Figures per run:
time to first judge request (fake judge's first arrival minus the command's start, both ``time.time()``),
whole-process wall time, whole-process CPU (user + sys of the child and the children it waited for, from
``os.wait4``), rows/s of the whole process, and the run process's CPU seconds when the first request arrived
(read from /proc by a 10 ms poller: roughly the time to first request of a quiet machine, where no run waits for
a core). The background server is not a child of the run: its own CPU (its process group's, read from /proc
after the cold run) is printed separately, never hidden in the figures.

``--code-dir`` runs another checkout's code (e.g. ``git archive <base commit>``) with the same harness, for
before/after figures; code without a ``server`` command boots Prefect's temporary server on every run.
``--vs DIR`` alternates: after the cold run, each warm run of ``--code-dir`` is followed by one of ``DIR``'s
(same server, same machine moment), and both medians are printed: on a shared machine the pairs are the
comparison, not two separate invocations.
Figures printed, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.throughput import free_port, make_table, start_judge, write_dataset  # noqa: E402

_DROPPED = ("PREFECT_", "OPENAI_", "RECALL_BENCH_")
#: Dropped too: with it set (CI images, sandboxes) every run compiles recall-bench's modules from source again
#: (~0.25 s of CPU before the first request here), which a user's repeated runs read from ``__pycache__``.
_NOT_A_USERS = ("PYTHONDONTWRITEBYTECODE",)


def child_env(tmp: Path, code_dir: Path, port: int) -> dict[str, str]:
    """The user's environment without Prefect/OpenAI/recall-bench settings; state and Prefect home in ``tmp``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED) and k not in _NOT_A_USERS}
    env.update(
        PYTHONPATH=str(code_dir),
        OPENAI_API_KEY="sk-bench",
        PREFECT_HOME=str(tmp / "prefect-home"),
        RECALL_BENCH_STATE_DIR=str(tmp / "state"),
        RECALL_BENCH_SERVER_PORT=str(port),
    )
    return env


def group_cpu_s(pgid: int) -> float:
    """User + sys seconds of every live process in process group ``pgid`` (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the command: state ppid pgrp ... utime(11) stime(12)
            total += int(fields[11]) + int(fields[12])
    return total / tick


def server_pid(state: Path) -> int | None:
    try:
        return int(json.loads((state / "server.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def process_cpu_s(pid: int) -> float | None:
    """User + sys seconds of one live process so far (Linux /proc), None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def watch_first_request(pid: int, stats_url: str, found: dict) -> None:
    """Poll the fake judge every 10 ms; at its first request, note the run process's CPU seconds so far.

    CPU to the first request is what the wait would be on a quiet machine (plus the local server's replies):
    on a shared, loaded machine the wall time to first request also counts the time spent waiting for a core.
    """
    while "cpu" not in found:
        try:
            stats = json.loads(urllib.request.urlopen(stats_url, timeout=5).read())
        except OSError:
            return
        if stats["first_request_at"] is not None:
            found["cpu"] = process_cpu_s(pid)
            return
        if process_cpu_s(pid) is None:
            return
        time.sleep(0.01)


def one_run(cmd: list[str], env: dict[str, str], code_dir: Path, stats_url: str, log: Path) -> dict:
    urllib.request.urlopen(stats_url + "?reset=1", timeout=5).read()
    found: dict = {}
    with open(log, "wb") as out:
        t0 = time.time()
        w0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=code_dir, env=env, stdout=out, stderr=subprocess.STDOUT)
        watcher = threading.Thread(target=watch_first_request, args=(proc.pid, stats_url, found), daemon=True)
        watcher.start()
        _, status, usage = os.wait4(proc.pid, 0)
        watcher.join(5)
        wall = time.perf_counter() - w0
        proc.returncode = os.waitstatus_to_exitcode(status)
    stats = json.loads(urllib.request.urlopen(stats_url, timeout=5).read())
    if proc.returncode != 0 or not stats["requests"]:
        raise RuntimeError(f"run failed ({proc.returncode}, {stats['requests']} requests):\n{log.read_text()[-3000:]}")
    first = stats["first_request_at"]
    return {
        "first_request_s": first - t0,
        "cpu_to_first_s": found.get("cpu"),
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "requests": stats["requests"],
        "prompt_tokens": stats.get("prompt_tokens", 0),
    }


@dataclass
class Bench:
    """What every run of a benchmark shares: its temporary folder, the fake judge, the environment, the dataset."""

    tmp: Path
    base_url: str
    env: dict[str, str]
    data: str


@contextlib.contextmanager
def bench_setup(code_dir: Path, rows: int, latency: float, prefix: str, keep: bool = False) -> Iterator[Bench]:
    """A temporary folder with a dataset of ``rows``, the fake judge at ``latency`` and a recall-bench state
    directory; afterwards the local server the runs started is stopped, the judge too, the folder removed."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    judge, base_url = start_judge(latency, tmp)
    env = child_env(tmp, code_dir, free_port())
    try:
        yield Bench(tmp, base_url, env, write_dataset(tmp / "data" / "eval.parquet", make_table(rows)))
    finally:
        subprocess.run([sys.executable, "-m", "recall_tasks", "server", "stop"], cwd=code_dir, env=env,
                       capture_output=True, timeout=60)  # fmt: skip
        judge.terminate()
        judge.wait(10)
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


def alternate(code_dir: Path, vs: Path | None, warm: int) -> Iterator[tuple[str, Path, int]]:
    """``(name, checkout, i)`` for each run: ``cold`` (``code_dir``'s first), then ``warm`` runs of ``code_dir``,
    each followed by one of ``vs`` (named ``vs warm``) when given."""
    yield "cold", code_dir, 0
    for i in range(1, 1 + warm):
        yield "warm", code_dir, i
        if vs is not None:
            yield "vs warm", vs.resolve(), i


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--warm", type=int, default=3, help="runs after the cold one")
    parser.add_argument("--code-dir", type=Path, default=ROOT, help="checkout whose recall_tasks is run")
    parser.add_argument("--api-url", default=None, help="PREFECT_API_URL for the runs (default: none, as a new user)")
    parser.add_argument("--vs", type=Path, default=None, help="another checkout, run alternately with --code-dir")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    code_dir = args.code_dir.resolve()
    results: list[tuple[str, dict]] = []
    server_cpu: float | None = None
    with bench_setup(code_dir, args.rows, args.latency, "recall-startup-", keep=args.keep) as bench:
        stats_url = bench.base_url.removesuffix("/v1") + "/stats"
        if args.api_url:
            bench.env["PREFECT_API_URL"] = args.api_url
        for name, where, i in alternate(code_dir, args.vs, args.warm):
            tag = f"{name.replace(' ', '-')}{i}"
            out = str(bench.tmp / f"out-{tag}")
            cmd = [sys.executable, "-m", "recall_tasks", "run", bench.data, "--output", out, "--judge", "openai",
                   "--base-url", bench.base_url, "--max-concurrency", str(args.concurrency)]  # fmt: skip
            run_env = {**bench.env, "PYTHONPATH": str(where)}
            results.append((name, one_run(cmd, run_env, where, stats_url, bench.tmp / f"{tag}.log")))
            pid = server_pid(bench.tmp / "state")
            if i == 0 and pid is not None:
                server_cpu = group_cpu_s(pid)

    vs = f", alternating with vs {args.vs.resolve()}" if args.vs else ""
    print(f"\nrecall-bench start-up: {args.rows} rows, judge latency {args.latency * 1000:.0f} ms, "
          f"concurrency {args.concurrency}, code {code_dir}{vs}\n")  # fmt: skip
    header = (
        f"{'run':<15} {'first request s':>15} {'CPU to 1st s':>12} {'wall s':>8} {'CPU s':>7} {'rows/s':>8} "
        f"{'requests':>9}"
    )
    print(header)
    print("-" * len(header))

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    for name, r in results:
        print(
            f"{name:<15} {r['first_request_s']:>15.2f} {fmt(r['cpu_to_first_s']):>12} {r['wall_s']:>8.2f} "
            f"{r['cpu_s']:>7.2f} {args.rows / r['wall_s']:>8.0f} {r['requests']:>9}"
        )
    for prefix in ("", "vs "):
        warm = [r for name, r in results if name == prefix + "warm"]
        if warm:
            keys = ("first_request_s", "cpu_to_first_s", "wall_s", "cpu_s")
            med = {k: statistics.median(r[k] for r in warm if r[k] is not None) for k in keys}
            print(
                f"{prefix + 'warm median':<15} {med['first_request_s']:>15.2f} {fmt(med['cpu_to_first_s']):>12} "
                f"{med['wall_s']:>8.2f} {med['cpu_s']:>7.2f} {args.rows / med['wall_s']:>8.0f}"
            )
    if server_cpu is not None:
        print(f"\nbackground Prefect server CPU after the cold run (not in the figures above): {server_cpu:.2f} s")


if __name__ == "__main__":
    main()
