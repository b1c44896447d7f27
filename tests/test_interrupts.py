"""SIGINT and SIGTERM in the middle of a real ``recall-bench run`` process, then a resume.

The run judges against the fake OpenAI server with 200 ms of latency at concurrency 8 (~40 requests/s), so a
signal lands with chunks in flight. The fake server time-stamps every request's arrival: what arrives after
the signal is what the run still sent. Without the abort, the chunk loop waited for every chunk in flight
(up to 4 x 50 rows here: ~150 more requests); the bound below is two rounds of the concurrency.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.test_caching import ROOT, cli_env, results_of, write
from tests.test_pipeline import expected, make_rows

ROWS = 300
CONCURRENCY = 8
AFTER_SIGNAL_MAX = 2 * CONCURRENCY
MESSAGE = re.compile(r"^interrupted: rerun the same command to resume \((\d+) rows judged so far are cached\)$", re.M)


@pytest.fixture
def judge_env(fake_openai, monkeypatch):
    from tests import judge_script
    from tests.test_pipeline import KEY

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    return fake_openai


#: ``recall-bench`` with an exit handler that prints a marker when the process goes through the normal shutdown
#: (the interpreter's own, ``sys.exit``): a finished run's exit runs the exit handlers, last.
CLI = (
    "import atexit; atexit.register(print, 'AT EXIT', flush=True)\n"
    "from recall_tasks.cli.app import console_main; console_main()"
)


def start(judge, data: str, out: Path, cli: str = CLI, **env: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-c", cli, "run", data, "--output", str(out), "--judge", "openai",
           "--base-url", judge.base_url, "--chunk-size", "50", "--max-concurrency", str(CONCURRENCY)]  # fmt: skip
    return subprocess.Popen(
        cmd, env=cli_env(judge, **env), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def assert_clean(text: str) -> None:
    """No traceback, no Prefect crash report, no error from a closed client: only our lines."""
    for bad in ("Traceback", "client has been closed", "ERROR", "Crash detected", "Finished in state"):
        assert bad not in text, text


@pytest.mark.parametrize(
    ("sig", "code", "twice", "resume"),
    [(signal.SIGINT, 130, False, True), (signal.SIGTERM, 143, False, False), (signal.SIGINT, 130, True, True)],
    ids=["sigint", "sigterm", "sigint-twice"],
)
@pytest.mark.concurrency
def test_interrupt_stops_judging_commits_nothing_and_the_rerun_resumes(
    prefect_harness, judge_env, tmp_path, sig, code, twice, resume
):
    """Every signal: exit code, bounded requests after it, the message, nothing committed. The resume (a second
    process, the same for every signal: the pending marker and the row cache) is run after SIGINT and SIGINT x2.

    SIGINT lands while the first window of chunks (4 of 50) is judged; SIGTERM lands later in the run. A second
    SIGINT 0.2 s after the first lands in the clean-up and is ignored: still exit 130."""
    rows = make_rows(ROWS, seed=21)
    data = write(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    judge_env.latency_s = 0.2
    proc = start(judge_env, data, out)
    assert judge_env.wait_for_requests(40 if sig == signal.SIGINT else 230, timeout=240), proc.communicate()
    at_signal = time.monotonic()
    proc.send_signal(sig)
    if twice:  # a second Ctrl-C while the first one's clean-up runs
        time.sleep(0.2)
        proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)

    assert proc.returncode == code, stdout + stderr
    sent_after = judge_env.chat_requests_since(at_signal)
    print(f"\n[{sig.name}{' x2' if twice else ''}] exit {proc.returncode}, {sent_after} requests after the signal")
    assert sent_after <= AFTER_SIGNAL_MAX, f"{sent_after} judge requests after the signal"
    found = MESSAGE.findall(stderr)
    assert len(found) == 1, stderr
    cached = int(found[0])
    judged = len(judge_env.chat_requests)
    assert 0 < cached <= judged < ROWS
    assert_clean(stdout + stderr)
    assert not (out / "results").exists() and not (out / "runs").exists()  # nothing committed
    (marker,) = (out / "_pending").glob("*.json")
    interrupted_run = json.loads(marker.read_text())["run_id"]
    if not resume:
        return

    judge_env.latency_s = 0.0
    rerun = start(judge_env, data, out)
    stdout, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stdout + stderr
    assert stdout.endswith("AT EXIT\n")  # a finished run's exit runs the exit handlers, last
    assert_clean(stdout + stderr)
    rejudged = len(judge_env.chat_requests) - judged
    assert rejudged <= ROWS - cached < ROWS  # the cached rows were not judged again
    (run,) = DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist()
    assert run["run_id"] == interrupted_run and run["rows"] == ROWS and run["errors"] == 0
    got = results_of(out, run["run_id"])  # asserts each row appears once
    assert set(got) == {r["row_id"] for r in rows}
    assert all(got[r["row_id"]]["score"] == pytest.approx(expected(r)) for r in rows)
    # what the interrupted attempt paid is the run's: the rows it judged are not "cached" and their requests count
    # (before: the runs row held only the resumed attempt's requests, every row the first one judged was free);
    # the calls cancelled in flight (at most the concurrency, plus those sent after the signal) left no answer
    sent = len(judge_env.chat_requests)
    assert sent - CONCURRENCY - AFTER_SIGNAL_MAX <= run["requests"] <= sent, (run["requests"], sent, cached)
    assert not any(r["cached"] for r in got.values())
    assert sum(r["requests"] for r in got.values()) == run["requests"]


#: The CLI with a SIGINT sent to itself in the middle of Prefect's import: the module of Prefect's automations
#: schemas (imported by ``import prefect``, its models built by pydantic) sends it, then runs its own code, and
#: notes in ``MARK`` when that code ran to its end. Where the signal's KeyboardInterrupt was raised inside such
#: an import, pydantic-core wrapped it in a SchemaError and Prefect printed "Failed to initialize plugins" and a
#: traceback, and went on (seen twice in repeated runs under load, when a Ctrl-C landed there).
CLI_SIGNAL_IN_IMPORT = """
import importlib.abc, importlib.machinery, os, signal, sys
TARGET, MARK = "prefect.events.schemas.automations", os.environ["MARK"]
class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module
        def exec_module(module):
            open(MARK, "a").write("sent\\n")
            os.kill(os.getpid(), signal.SIGINT)
            run(module)
            open(MARK, "a").write("imported whole\\n")
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Hook())
from recall_tasks.cli.app import console_main; console_main()
"""


@pytest.mark.concurrency
def test_an_interrupt_inside_prefects_import_ends_the_process_at_once(prefect_harness, judge_env, tmp_path):
    """Before the run has anything to clean up, Ctrl-C ends the process by the signal's default action (the
    shell's status 130): no traceback, no "Failed to initialize plugins", no judge request, nothing written."""
    rows = make_rows(ROWS, seed=22)
    data = write(tmp_path / "eval.parquet", rows)
    out, mark = tmp_path / "out", tmp_path / "mark"
    proc = start(judge_env, data, out, cli=CLI_SIGNAL_IN_IMPORT, MARK=str(mark))
    stdout, stderr = proc.communicate(timeout=240)

    assert mark.read_text().splitlines() == ["sent"], stderr  # ended inside the import, at the signal
    assert proc.returncode == -signal.SIGINT, stdout + stderr
    assert_clean(stdout + stderr)
    assert "Failed to initialize plugins" not in stderr and "AT EXIT" not in stdout
    assert judge_env.requests == [] and not out.exists()
