"""--tpm measured against a token quota: ~3,000-token prompts, a server counting prompt tokens over a sliding minute.

    python -m benchmarks.token_quota [--tpm 30000] [--requests 12] [--processes 1] [--count-only]

``tests/fake_openai.FakeOpenAI`` in this process with ``tpm_quota`` (prompt tokens over a sliding 60 s window, 429
beyond it) and the test judge script. ``--processes`` child processes each send ``--requests`` judge requests of
~3,250 prompt tokens at once through an ``OpenAIJudge`` with ``--tpm`` and ``max_retries=0`` (a 429 is an error,
never hidden by a retry; ``--count-only``: the server counts and refuses nothing, to see what a limiter lets
through). One process: the judge's own limiter (no Prefect). Several: they share the fleet limit
in a real Prefect server (``benchmarks/throughput.start_prefect_server``), as a run's worker processes do.
Printed: requests accepted and refused, prompt tokens sent, the busiest 60 s window against the quota and its share,
the span from the first to the last request. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.throughput import ROOT, start_prefect_server


def child(base_url: str, tpm: int, requests: int, key: str) -> None:
    sys.path.insert(0, str(ROOT))
    from recall_tasks.config import RunParams
    from tests.test_token_quota import _send

    params = RunParams(dataset_uri=".", tokens_per_minute=tpm, rate_limit_key=key) if key else None
    t0 = time.perf_counter()
    errors = _send(_Server(base_url), tpm, requests, params)  # type: ignore[arg-type]
    print(json.dumps({"wall_s": time.perf_counter() - t0, "errors": errors}))


class _Server:
    """What ``_send`` reads of a server: its URL (the server runs in the parent)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tpm", type=int, default=30_000)
    parser.add_argument("--requests", type=int, default=12, help="requests per process (~3,250 prompt tokens each)")
    parser.add_argument("--processes", type=int, default=1, help="1: the judge's limiter alone; more: fleet-wide")
    parser.add_argument("--count-only", action="store_true", help="the server counts tokens, refuses none")
    parser.add_argument("--child", nargs=4, metavar=("BASE_URL", "TPM", "N", "KEY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        base_url, tpm, n, key = args.child
        child(base_url, int(tpm), int(n), key if key != "-" else "")
        return

    sys.path.insert(0, str(ROOT))
    from tests import judge_script
    from tests.fake_openai import FakeOpenAI

    tmp = Path(tempfile.mkdtemp(prefix="recall-tokenquota-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_LOGGING_LEVEL": "WARNING", "PREFECT_HOME": str(tmp)}
    prefect = None
    if args.processes > 1:
        prefect, env["PREFECT_API_URL"] = start_prefect_server(tmp / "prefect")
    server = FakeOpenAI(judge_script.responder, tpm_quota=10**12 if args.count_only else args.tpm).start()
    server.record = False
    key = f"bench-{tmp.name}" if prefect else "-"
    try:
        cmd = [sys.executable, "-m", "benchmarks.token_quota", "--child", server.base_url, str(args.tpm),
               str(args.requests), key]  # fmt: skip
        procs = [
            subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True) for _ in range(args.processes)
        ]
        results = []
        for proc in procs:
            stdout, _ = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"a process failed ({proc.returncode}):\n{stdout[-3000:]}")
            results.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        server.stop()
        if prefect is not None:
            prefect.terminate()
            prefect.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    accepted = server.tpm_accepted
    sent = sum(n for _, n in accepted)
    span = accepted[-1][0] - accepted[0][0] if len(accepted) > 1 else float("nan")
    busiest = server.busiest_tokens()
    where = "the server counting only, " if args.count_only else ""
    where += "the judge's limiter alone" if prefect is None else f"{args.processes} processes sharing the fleet limit"
    print(f"--tpm {args.tpm}, {args.processes} x {args.requests} requests, {where}; {os.cpu_count()} cores")
    print(f"accepted {len(accepted)} requests ({sent} prompt tokens) in {span:.1f} s; 429s {server.tpm_429s}")
    print(f"busiest 60 s window: {busiest} prompt tokens of the {args.tpm} quota = {100 * busiest / args.tpm:.1f} %")
    for r in results:
        print(f"  process: {r['wall_s']:.1f} s, {len(r['errors'])} errors")


if __name__ == "__main__":
    main()
