"""Worker state per run attempt and per chunk (``pipeline/workers.py``), on real Dask workers of several threads.

A Dask worker scores several chunks at once on its process's one event loop and serves run after run: what one
chunk ends must not close what another uses, a resumed run (same run id, new attempt) must not inherit the old
attempt's tripped breaker or spent budget, and evicting a cached plan must not close a judge still in flight.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from recall_tasks.config import RunParams
from recall_tasks.io.blocks import iter_blocks
from recall_tasks.pipeline import steps, workers
from recall_tasks.pipeline.flow import LOCAL_CLUSTER_HTTP
from tests import judge_script
from tests.fake_openai import FakeOpenAI
from tests.test_pipeline import KEY, make_rows, write_parquet


@pytest.fixture(scope="module")
def cluster():
    """One long-lived Dask worker process with three threads, as a shared cluster serves run after run."""
    import distributed

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", KEY)  # the worker process inherits it
        with (
            distributed.LocalCluster(n_workers=1, threads_per_worker=3, processes=True, **LOCAL_CLUSTER_HTTP) as c,
            distributed.Client(c) as client,
        ):
            yield client


def _spec(plan: steps.RunPlan) -> workers.ChunkSpec:
    block = next(iter_blocks(plan.dataset, plan.params.chunk_size))
    return workers.chunk_spec(plan, 0, block, steps.chunk_key(plan, block))


def _params(tmp_path, name: str, base_url: str, rows: list[dict[str, Any]], **kw: Any) -> RunParams:
    data = write_parquet(tmp_path / name / "eval.parquet", rows)
    return RunParams(
        dataset_uri=data, output_uri=str(tmp_path / name / "out"), judge="openai", base_url=base_url,
        chunk_size=len(rows), task_runner="dask", max_retries=0, **kw,
    )  # fmt: skip


def test_a_resumed_run_starts_with_a_fresh_breaker_on_a_long_lived_worker(cluster, tmp_path):
    """Attempt 1 trips the worker's breaker (an outage), the flow dies; the resumed attempt (same run id) on the
    same worker process judges its rows once the endpoint is back, instead of "not judged" by the old breaker."""
    from tests.fake_openai import Status

    with FakeOpenAI(judge_script.responder) as server:
        params = _params(tmp_path, "resumed", server.base_url, make_rows(12, seed=5), max_concurrency=2)
        first = steps.plan_run(params)
        server.enqueue(*[Status(503)] * 12)
        report = cluster.submit(workers.score_spec, _spec(first), pure=False).result()
        assert report.stopped and "failed 10 attempts in a row" in report.stopped  # tripped in the worker
        server.reset()  # the endpoint is back (the outage's unused faults dropped)
        steps.let_go(first)  # what the dying flow does on its way out: its lease goes, its marker stays
        again = steps.plan_run(params)  # the same command after the flow died: the run is resumed
        assert again.resumed and again.run_id == first.run_id and again.attempt != first.attempt
        report = cluster.submit(workers.score_spec, _spec(again), pure=False).result()
        assert report.stopped is None and (report.errors, report.not_judged, report.scored) == (0, 0, 12), report
        assert len(server.chat_requests) == 12  # every row judged by the second attempt
        steps.release(first)
        steps.release(again)


def test_evicting_the_oldest_plan_never_closes_its_judge_in_flight(cluster, tmp_path):
    """A slow chunk of run A, then chunks of four other runs on the same worker: A's plan is the oldest of five
    (``KEEP_PLANS`` 4) while its judge calls are in flight; they must finish, not fail on a closed client."""
    from tests.fake_openai import extract_user_text

    release = threading.Event()

    def slow_first(body: dict[str, Any]) -> str:
        if "slow item" in extract_user_text(body):
            release.wait(30)
        return judge_script.responder(body)

    with FakeOpenAI(slow_first) as server:
        slow_rows = make_rows(4, seed=9)
        for row in slow_rows:
            row["question"] = "A slow item?"
        plans = [steps.plan_run(_params(tmp_path, "a", server.base_url, slow_rows))]
        future_a = cluster.submit(workers.score_spec, _spec(plans[0]), pure=False)
        assert server.wait_for_requests(4, timeout=60)  # A's calls are in flight, held by the server
        for name in "bcde":
            plans.append(steps.plan_run(_params(tmp_path, name, server.base_url, make_rows(3, seed=ord(name)))))
            report = cluster.submit(workers.score_spec, _spec(plans[-1]), pure=False).result()
            assert report.errors == 0, report
        time.sleep(0.2)
        release.set()
        report_a = future_a.result(timeout=60)
        assert (report_a.errors, report_a.not_judged, report_a.scored) == (0, 0, 4), report_a
        for plan in plans:
            steps.release(plan)


@pytest.mark.concurrency
def test_a_chunk_ending_never_closes_the_budget_client_another_chunk_uses(prefect_harness, fake_openai, tmp_path):
    """``--max-requests`` on a Dask worker of four threads: chunks end while others take grants from the run's
    counter on the process's one loop. Before, each chunk's end closed that loop's Prefect client under the
    others and the run stopped with a ConfigError."""
    from recall_tasks.pipeline.flow import recall_benchmark

    fake_openai.set_responder(judge_script.responder)
    fake_openai.latency_s = 0.02
    data = write_parquet(tmp_path / "eval.parquet", make_rows(60, seed=31), row_group_size=60)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", KEY)
        summary = recall_benchmark(
            RunParams(
                dataset_uri=data,
                output_uri=str(tmp_path / "out"),
                judge="openai",
                base_url=fake_openai.base_url,
                chunk_size=3,
                task_runner="dask",
                workers=1,
                max_workers=4,
                max_requests=500,
                max_concurrency=2,
            )  # fmt: skip
        )
    assert (summary["status"], summary["scored"], summary["errors"]) == ("completed", 60, 0)
