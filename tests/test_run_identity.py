"""One run identity (issue 57, item 6): the run key holds what changes a run's results and where they are recorded,
never how the run is carried out.

Before, the key hashed every parameter but a few named ones: Ctrl-C, then the same command with another
``--max-concurrency`` or ``--chunk-size``, started a new run with a fresh ``--max-requests`` budget. Now such a
rerun resumes the interrupted run (its run id, its lease, what it spent), and a rerun with another model, threshold
or label is another run.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from recall_tasks.config import RunParams
from recall_tasks.pipeline import steps
from tests import judge_script
from tests.test_caching import ROOT, cli_env, results_of, write
from tests.test_pipeline import KEY, make_rows


@pytest.fixture
def judge_env(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    fake_openai.latency_s = 0.1
    return fake_openai


#: Parameters that say how a run is carried out, waited for, capped or gated: an interrupted run rerun with any
#: of them changed is the same run.
HOW = [
    {"max_concurrency": 16},
    {"chunk_size": 7},
    {"max_workers": 2},
    {"tokens_per_minute": 100_000},
    {"requests_per_minute": 600},
    {"rate_limit_key": "team-a"},
    {"timeout_s": 5.0},
    {"max_retries": 1},
    {"task_runner": "processes"},
    {"max_requests": 80},
    {"max_cost_usd": 1.0},
    {"refresh_cache": True},
    {"max_error_rate": 0.5},
    {"baseline": None},
    {"tolerance": 0.1},
    {"fail_on_regression": True},
    {"allow_incomparable": True},
    {"wait_for_lock": True},
]

#: Parameters that change what the run's rows or run row hold, or where they are recorded: another run.
WHAT = [
    {"model": "gpt-4.1-mini"},
    {"threshold": 0.9},
    {"scale": 2.0},
    {"strict_mode": True},
    {"include_reason": False},
    {"on_missing": "zero"},
    {"label": "index-v2"},
    {"index_version": "v2"},
    {"dataset_name": "nightly"},
    {"segment_by": ["category"]},
    {"on_overlong": "send"},
    {"prices": {"gpt-4o-mini": (1.0, 2.0)}},
]


def _params(data: str, out: Path, judge: Any, **kw: Any) -> RunParams:
    base: dict[str, Any] = {"chunk_size": 10, "max_concurrency": 4, "max_requests": 40}
    return RunParams(dataset_uri=data, output_uri=str(out), judge="openai", base_url=judge.base_url, **{**base, **kw})


def _plan(params: RunParams) -> Any:
    """The run an attempt with ``params`` plans, left as an interrupted attempt leaves it (lease gone, marker kept)."""
    plan = steps.plan_run(params, share=False)
    steps.let_go(plan)
    steps.release(plan)
    return plan


def test_a_rerun_resumes_whatever_says_how_and_starts_anew_on_what_changes_results(judge_env, tmp_path):
    data = write(tmp_path / "eval.parquet", make_rows(30, seed=3))
    out = tmp_path / "out"
    first = _plan(_params(data, out, judge_env))
    assert not first.resumed
    for change in HOW:
        again = _plan(_params(data, out, judge_env, **change))
        assert (again.resumed, again.run_id, again.run_key) == (True, first.run_id, first.run_key), change
    for change in WHAT:
        other = _plan(_params(data, out, judge_env, **change))
        assert not other.resumed and other.run_id != first.run_id and other.run_key != first.run_key, change
    assert _plan(_params(data, tmp_path / "elsewhere", judge_env)).run_key != first.run_key  # another output
    edited = make_rows(30, seed=3)
    edited[4]["ground_truth"] += " Oscar papa."
    other_data = write(tmp_path / "edited" / "eval.parquet", edited)
    assert _plan(_params(other_data, out, judge_env)).run_key != first.run_key  # other data
    again = _plan(_params(data, out, judge_env))  # the first command once more: still its run
    assert (again.resumed, again.run_id) == (True, first.run_id)


#: A value other than the test's of every parameter the run key holds by name (``config.RUN_KEY_FIELDS``) or
#: reads itself (the config hash's threshold, scale, strict mode, on_missing and output).
KEYED: dict[str, Any] = {
    "dataset_uri": "other.parquet", "dataset_name": "nightly", "output_uri": "elsewhere", "format": "parquet",
    "catalog": "team", "namespace": "recall", "label": "v2", "index_version": "v2", "judge": "lexical",
    "base_url": "http://127.0.0.1:9/v1", "context_window": 1000, "on_overlong": "send", "columns": {"input": "q"},
    "retriever": "pkg:retrieve", "retrieval_uri": "new-index.parquet", "context_from": "tool-results",
    "context_extractor": "pkg:extract", "segment_by": ["category"], "canary": "canary.jsonl",
    "prices": {"gpt-4o-mini": (1.0, 2.0)}, "batch": True,
    "threshold": 0.9, "scale": 2.0, "strict_mode": True, "on_missing": "zero",
}  # fmt: skip

#: ... and of every parameter it leaves out: how the run is carried out, capped, decided once judged or waited for.
UNKEYED: dict[str, Any] = {
    "max_concurrency": 16, "requests_per_minute": 60, "tokens_per_minute": 1000, "rate_limit_key": "team-a",
    "chunk_size": 7, "max_workers": 2, "timeout_s": 5.0, "max_retries": 1, "task_runner": "dask", "workers": 2,
    "dask_address": "tcp://127.0.0.1:8786", "storage_options": {"region": "eu-west-1"}, "cache": False,
    "refresh_cache": True, "cache_uri": "other-cache", "max_cost_usd": 1.0, "max_requests": 80,
    "max_error_rate": 0.5, "baseline": None, "tolerance": 0.1, "fail_on_regression": True,
    "allow_incomparable": True, "require_baseline": True, "batch_wait": True, "poll_interval_s": 5.0,
    "batch_timeout_s": 60.0, "batch_fallback": "live", "batch_collect_only": True, "wait_for_lock": True,
}  # fmt: skip

#: Parameters that reach the key through the metric's fingerprint (``scoring.metric_fingerprint``, the config
#: hash's) or the id metrics' settings: another model or include_reason is another run (tested above).
BY_THE_METRIC = {"metric", "model", "include_reason", "units", "extractor_model", "k", "id_pattern", "qrels_uri",
                 "verdict_metric"}  # fmt: skip


def test_every_parameter_is_in_the_run_key_or_resumes_the_run(judge_env, tmp_path):
    """The key is an allowlist: a new parameter is out of it unless named; this test makes each one a decision."""
    assert set(KEYED) | set(UNKEYED) | BY_THE_METRIC == set(RunParams.model_fields)
    plan = _plan(_params(write(tmp_path / "eval.parquet", make_rows(10, seed=4)), tmp_path / "out", judge_env))

    def key(name: str, value: Any) -> str:
        return steps._run_key(plan.params.model_copy(update={name: value}), plan.dataset, plan.metric)

    assert [name for name, value in KEYED.items() if key(name, value) == plan.run_key] == []
    assert [name for name, value in UNKEYED.items() if key(name, value) != plan.run_key] == []


def _cli(judge: Any, data: str, out: Path, chunk_size: int, concurrency: int) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "recall_tasks", "run", data, "--output", str(out), "--judge", "openai",
           "--base-url", judge.base_url, "--chunk-size", str(chunk_size), "--max-concurrency", str(concurrency),
           "--max-requests", "40"]  # fmt: skip
    pipe = subprocess.PIPE
    return subprocess.Popen(cmd, env=cli_env(judge), cwd=ROOT, stdout=pipe, stderr=pipe, text=True)


@pytest.mark.concurrency
def test_ctrl_c_then_another_concurrency_and_chunk_size_resumes_the_run_and_its_budget(
    prefect_harness, judge_env, tmp_path
):
    """--max-requests 40, Ctrl-C after ~24 requests, then the command with --max-concurrency 8 --chunk-size 7
    (was 4 and 10): before, a new run with a fresh budget (~64 requests paid in all); now the same run id, both
    attempts' requests under one cap, and each row committed once although the chunks are cut elsewhere."""
    data = write(tmp_path / "eval.parquet", make_rows(120, seed=9))
    out = tmp_path / "out"
    first = _cli(judge_env, data, out, chunk_size=10, concurrency=4)
    assert judge_env.wait_for_requests(24, timeout=240), first.communicate()
    first.send_signal(signal.SIGINT)
    stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 130, stdout + stderr
    before = len(judge_env.chat_requests)
    (marker,) = (out / "_pending").glob("*.json")
    run_id = json.loads(marker.read_text())["run_id"]

    rerun = _cli(judge_env, data, out, chunk_size=7, concurrency=8)
    stdout, stderr = rerun.communicate(timeout=300)
    sent = len(judge_env.chat_requests)
    runs = [r for r in DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist() if r["segment_column"] is None]
    print(f"\n[identity] --max-requests 40: {before} requests before Ctrl-C, {sent} in all (exit {rerun.returncode})")
    assert [r["run_id"] for r in runs] == [run_id], stdout + stderr  # the interrupted run, not a new one
    assert rerun.returncode == 5 and runs[0]["status"] == "budget_exhausted", stdout + stderr
    assert sent <= 40  # both attempts under the one cap
    assert runs[0]["requests"] <= sent
    got = results_of(out, run_id)  # refuses a row committed twice
    assert sorted(got) == sorted(r["row_id"] for r in make_rows(120, seed=9))
    assert sum(r["requests"] for r in got.values()) == runs[0]["requests"]
    assert not list((out / "_pending").glob("*.json"))  # committed: nothing left to resume
