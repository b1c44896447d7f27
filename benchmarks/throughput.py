"""Throughput benchmark of the real pipeline (Parquet in, Prefect flow, Delta out) against a fake judge.

    python benchmarks/throughput.py [--rows 100000] [--latency 0.2] [--concurrency 100 400] [--million]

Starts a real Prefect server and a fake OpenAI-compatible judge (fixed latency, unlimited concurrency) in
their own processes, generates ragas-like rows (question, 3-5 sentence answer, 5 chunks), and runs each phase
in a fresh process so client CPU and peak RSS are the pipeline's own:
  first run at each concurrency; an unchanged rerun (caches); a rerun with 1 % of rows edited.
Figures printed, never asserted. Prompt tokens are the fake server's estimate (characters / 4; tiktoken's
encodings cannot be downloaded here), which is close to cl100k for English text.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
TOPICS = ["retrieval", "index", "embedding", "vector", "search", "ranking", "query", "document", "chunk", "model"]
WORDS = (
    "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river mountain forest ocean city "
    "engine signal market policy energy system network protocol storage cluster"
).split()


def sentence(rng: random.Random) -> str:
    words = rng.sample(WORDS, 8)
    return f"The {rng.choice(TOPICS)} {' '.join(words)} in {rng.randint(1900, 2030)}."


def make_table(n: int, seed: int = 0) -> pa.Table:
    rng = random.Random(seed)
    rows = {"row_id": [], "user_input": [], "reference": [], "retrieved_contexts": [], "category": []}
    for i in range(n):
        answer = [sentence(rng) for _ in range(rng.randint(3, 5))]
        chunks = [" ".join(sentence(rng) for _ in range(3)) for _ in range(5)]
        rows["row_id"].append(f"q{i:07d}")
        rows["user_input"].append(f"What do we know about {rng.choice(TOPICS)} {i}?")
        rows["reference"].append(" ".join(answer))
        rows["retrieved_contexts"].append(chunks)
        rows["category"].append(rng.choice(["a", "b", "c", "d"]))
    return pa.table(rows)


def write_dataset(path: Path, table: pa.Table) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=50_000)
    return str(path)


def edit_one_percent(table: pa.Table, seed: int = 1) -> pa.Table:
    rng = random.Random(seed)
    refs = table.column("reference").to_pylist()
    for i in rng.sample(range(len(refs)), max(1, len(refs) // 100)):
        refs[i] = refs[i] + " It was edited."
    return table.set_column(table.column_names.index("reference"), "reference", pa.array(refs))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_prefect_server(home: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/api"
    for _ in range(240):
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("prefect server did not start")


def start_judge(latency: float, tmp: Path) -> tuple[subprocess.Popen, str]:
    ready = tmp / "judge-url"
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.fake_judge", "--latency", str(latency), "--ready-file", str(ready)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
    )
    for _ in range(100):
        if ready.exists() and ready.read_text():
            return proc, ready.read_text()
        time.sleep(0.1)
    raise RuntimeError("fake judge did not start")


def run_phase(
    env: dict[str, str],
    dataset: str,
    output: str,
    base_url: str | None,
    concurrency: int,
    judge: str = "openai",
    profile: str | None = None,
    workers: int | None = None,
) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.run_phase",
        dataset,
        output,
        "--judge",
        judge,
        "--concurrency",
        str(concurrency),
    ]
    if base_url:
        cmd += ["--base-url", base_url]
    if profile:
        cmd += ["--profile", profile]
    if workers:
        cmd += ["--workers", str(workers)]
    stats_url = base_url.removesuffix("/v1") + "/stats?reset=1" if base_url else None
    if stats_url:
        urllib.request.urlopen(stats_url, timeout=5).read()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"phase failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if stats_url:
        out["peak_in_flight"] = json.loads(urllib.request.urlopen(stats_url, timeout=5).read())["peak_in_flight"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[100, 400])
    parser.add_argument("--million", action="store_true", help="also a 1M-row run (peak RSS)")
    parser.add_argument("--million-only", action="store_true", help="only the 1M-row run")
    parser.add_argument("--big-rows", type=int, default=1_000_000, help="size of the --million run")
    parser.add_argument("--profile", default=None, help="pyinstrument HTML of the first phase")
    parser.add_argument("--workers", type=int, default=None, help="chunk tasks in flight (RunParams.max_workers)")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="recall-bench-"))
    prefect, api_url = start_prefect_server(tmp / "prefect")
    judge, base_url = start_judge(args.latency, tmp)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PREFECT_API_URL": api_url,
        "PREFECT_HOME": str(tmp / "prefect"),
        "OPENAI_API_KEY": "sk-bench",
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    results: list[tuple[str, int, dict]] = []
    try:
        table = make_table(args.rows if not args.million_only else 10)
        data = write_dataset(tmp / "data" / "bench.parquet", table)
        edited = write_dataset(tmp / "edited" / "bench.parquet", edit_one_percent(table))
        for i, conc in enumerate(args.concurrency if not args.million_only else []):
            out = str(tmp / f"out-{conc}")
            profile = args.profile if i == 0 else None
            results.append(
                (
                    f"first run, concurrency {conc}",
                    conc,
                    run_phase(env, data, out, base_url, conc, profile=profile, workers=args.workers),
                )
            )
        out = str(tmp / f"out-{args.concurrency[0]}")
        if not args.million_only:
            results.append(
                (
                    "unchanged rerun",
                    args.concurrency[0],
                    run_phase(env, data, out, base_url, args.concurrency[0], workers=args.workers),
                )
            )
            results.append(
                (
                    "1%-edited rerun",
                    args.concurrency[0],
                    run_phase(env, edited, out, base_url, args.concurrency[0], workers=args.workers),
                )
            )
        if args.million or args.million_only:
            big = write_dataset(tmp / "million" / "bench.parquet", make_table(args.big_rows, seed=5))
            del table
            results.append(
                (f"{args.big_rows:,} rows", 400, run_phase(env, big, str(tmp / "out-million"), base_url, 400))
            )
    finally:
        judge.terminate()
        prefect.terminate()
        for p in (judge, prefect):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    header = (
        f"{'phase':<30} {'rows':>8} {'rows/s':>9} {'of ideal':>9} {'req/row':>8} {'tok/row':>8} "
        f"{'cpu ms/row':>10} {'peak RSS MB':>11} {'cached':>8} {'in flight':>9}"
    )
    print(f"\nrecall-bench throughput: {args.rows} rows, judge latency {args.latency * 1000:.0f} ms\n")
    print(header)
    print("-" * len(header))
    for name, conc, r in results:
        rate = r["rows"] / r["wall_s"]
        ideal = conc / args.latency
        of_ideal = f"{rate / ideal:.0%}" if name.startswith("first") else "-"
        print(
            f"{name:<30} {r['rows']:>8} {rate:>9.0f} {of_ideal:>9} {r['requests'] / r['rows']:>8.2f} "
            f"{r['prompt_tokens'] / max(1, r['requests']):>8.0f} {1000 * r['cpu_s'] / r['rows']:>10.3f} "
            f"{r['peak_rss_mb']:>11.0f} {r['cached']:>8} {r.get('peak_in_flight', '-'):>9}"
        )
    print(
        "\nrows/s of ideal = rows/s ÷ (concurrency ÷ latency); tok/row = prompt tokens per judged row "
        "(chars/4 estimate); cpu = client process CPU over the flow run."
    )


if __name__ == "__main__":
    main()
