"""Fleet-wide --rpm with real components: three ``recall-bench run`` processes, one Prefect server, one quota.

The fake OpenAI server enforces an RPM quota over a sliding 10 s window (429 beyond it). Three concurrent CLI
runs sharing ``--rpm`` must receive no 429 at all and still use most of the quota while they run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from recall_tasks.fleet import rate as fleet
from recall_tasks.judges.ratelimit import fleet_shape
from tests import judge_script
from tests.test_pipeline import KEY, make_rows, write_parquet

ROOT = Path(__file__).resolve().parents[1]
RPM = 1200  # 200 requests in any 10 s
ROWS = 120  # per run: one request per row; 360 in all, ~20 s at the fleet's rate


def cli_env() -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "OPENAI_API_KEY": KEY, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    env["PYTHONPATH"] = str(ROOT)
    return env


def run_cli(data: str, out: Path, base_url: str, *extra: str) -> subprocess.Popen[str]:
    cmd = [
        sys.executable, "-m", "recall_tasks", "run", data, "--output", str(out), "--judge", "openai",
        "--base-url", base_url, "--rpm", str(RPM), "--chunk-size", "40", "--max-retries", "0", *extra,
    ]  # fmt: skip
    return subprocess.Popen(cmd, env=cli_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture
def quota_server(fake_openai):
    fake_openai.set_responder(judge_script.responder)
    fake_openai.rpm_quota = RPM
    fake_openai.record = False  # not restored by reset(): set back below for the tests after this one
    yield fake_openai
    fake_openai.record = True


@pytest.mark.serial  # the share of the quota is a rate: a parallel test worker's load would cut it
@pytest.mark.concurrency
def test_three_runs_sharing_rpm_get_no_429_and_most_of_the_quota(prefect_harness, quota_server, tmp_path):
    procs = []
    for i in range(3):
        data = write_parquet(tmp_path / f"d{i}" / "eval.parquet", make_rows(ROWS, seed=40 + i), row_group_size=40)
        procs.append(run_cli(data, tmp_path / f"out{i}", quota_server.base_url))
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    # --max-retries 0: a 429 would have been a row error, and the server counts every one it sent
    assert quota_server.quota_429s == 0
    accepted = quota_server.quota_accepted
    assert len(accepted) == 3 * ROWS
    # the quota used while the runs send together: the busiest 10 s window (the whole span also holds the
    # processes' staggered start-ups, seconds of imports apart on a loaded machine, and the last run's tail)
    import bisect

    window = quota_server.quota_window_s
    busiest = max(bisect.bisect_right(accepted, t + window) - i for i, t in enumerate(accepted))
    allowed = RPM / 60 * window
    span = accepted[-1] - accepted[0]
    overall = len(accepted) / (RPM / 60 * span)
    assert busiest >= 0.8 * allowed, f"busiest {window:g} s: {busiest} of {allowed:g}; {overall:.0%} over {span:.1f} s"
    # the limit the runs shared: created once, shaped for the quota
    from prefect.client.orchestration import get_client

    shape = fleet_shape(RPM)
    with get_client(sync_client=True) as client:
        limits = [
            lim for lim in client.read_global_concurrency_limits(limit=200) if lim.name.startswith("recall-bench-rpm-")
        ]
    assert [(lim.limit, round(lim.slot_decay_per_second, 3)) for lim in limits] == [
        (shape.capacity * shape.scale, round(shape.rate * shape.scale, 3))
    ]


def test_a_limit_changed_by_another_run_is_set_back_and_a_deleted_one_fails_the_request(prefect_harness, caplog):
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    from recall_tasks.errors import JudgeTransientError

    name = fleet.limit_name("rpm", "test-changed")
    shape = fleet_shape(600)
    fleet.ensure_limit(name, shape, "--rpm", 600)
    with get_client(sync_client=True) as client:
        client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=99, active=False))
    fleet._ensured.done.clear()  # another process would not know it was changed either
    fleet.ensure_limit(name, shape, "--rpm", 600)
    with get_client(sync_client=True) as client:
        current = client.read_global_concurrency_limit_by_name(name)
        assert (current.limit, current.active) == (shape.capacity * shape.scale, True)
        assert any("set to this run's --rpm 600" in r.getMessage() for r in caplog.records)
        client.delete_global_concurrency_limit_by_name(name)
    source = fleet.PrefectGrants(name, shape, "--rpm", str(fleet.api_url()))

    async def grant() -> None:
        try:
            await source.grant(shape.grant)
        finally:
            await source.aclose()

    with pytest.raises(JudgeTransientError, match=f"fleet rate limit {name} granted nothing"):
        asyncio.run(grant())


@pytest.mark.concurrency
def test_worker_processes_share_one_budget_instead_of_one_each(prefect_harness, quota_server, tmp_path, monkeypatch):
    """Two worker processes at --rpm 240 (40 requests per 10 s): per process they would send up to twice that."""
    from recall_tasks.config import RunParams
    from recall_tasks.pipeline.flow import recall_benchmark

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    quota_server.rpm_quota = 240
    data = write_parquet(tmp_path / "eval.parquet", make_rows(60, seed=9), row_group_size=10)
    summary = recall_benchmark(
        RunParams(
            dataset_uri=data,
            output_uri=str(tmp_path / "out"),
            judge="openai",
            base_url=quota_server.base_url,
            requests_per_minute=240,
            max_retries=0,
            chunk_size=10,
            task_runner="processes",
            workers=2,
            rate_limit_key="test-workers",
            baseline=None,
        )  # fmt: skip
    )
    assert quota_server.quota_429s == 0 and len(quota_server.quota_accepted) == 60
    assert summary["errors"] == 0  # with limits per process, a third of the rows got a 429 (max_retries=0)
    span = quota_server.quota_accepted[-1] - quota_server.quota_accepted[0]
    assert span >= (60 - 40) / 4  # the fleet's pace: the first 10 s window holds at most 40 of the 60


@pytest.mark.concurrency
def test_max_requests_holds_for_the_whole_run_across_worker_processes(prefect_harness, judge_env, tmp_path):
    """Two worker processes, one --max-requests: the run's counter in Prefect, not one budget per worker."""
    from prefect.client.orchestration import get_client

    from recall_tasks.config import RunParams
    from recall_tasks.errors import BudgetExhausted
    from recall_tasks.pipeline.flow import recall_benchmark

    data = write_parquet(tmp_path / "eval.parquet", make_rows(60, seed=11), row_group_size=10)
    with pytest.raises(BudgetExhausted) as stopped:
        recall_benchmark(
            RunParams(
                dataset_uri=data,
                output_uri=str(tmp_path / "out"),
                judge="openai",
                base_url=judge_env.base_url,
                max_requests=25,
                chunk_size=10,
                task_runner="processes",
                workers=2,
                baseline=None,
            )  # fmt: skip
        )
    summary = stopped.value.summary
    assert len(judge_env.chat_arrivals) == 25  # per worker, each of the two would have allowed 25
    assert summary["status"] == "budget_exhausted" and summary["scored"] == 25
    assert "--max-requests 25, the whole run" in summary["status_reason"]
    with get_client(sync_client=True) as client:  # the run's counter went with the commit
        names = [lim.name for lim in client.read_global_concurrency_limits(limit=200)]
    assert not [n for n in names if n.startswith(f"recall-bench-requests-{summary['run_id']}")]


#: --max-cost-usd of the test below, in USD: about 80 of its 240 rows at gpt-4o-mini's price (a call costs 30-90
#: micro-dollars on the fake server, whose tokens are a quarter of the characters). Each attempt reserves its worst
#: case first (330-460 micro-dollars for these rows), and a worker that cannot cover one stops the run while the
#: other worker holds what it reserved: its grant (a fiftieth of the budget), its attempts in flight (two: two chunks
#: in flight for the run) and an allowance under one worst case. At 0.0007 one worst case in flight filled the run,
#: and a second worker's first attempt stopped the run after 3 rows whenever it came while the first's was in
#: flight (a loaded machine); at 0.005 the stop leaves at most 100 + 4 x 460 micro-dollars unspent.
COST_BUDGET = 0.005
COST_ROWS = 240


@pytest.mark.concurrency
def test_max_cost_usd_holds_for_the_whole_run_across_worker_processes(prefect_harness, judge_env, tmp_path):
    """Two worker processes, one --max-cost-usd: the run's cost counter in Prefect, as one budget on threads.

    Each attempt reserves its worst case from the run's counter before it is sent: one budget per worker would
    spend up to twice the budget.
    """
    from prefect.client.orchestration import get_client

    from recall_tasks.config import RunParams
    from recall_tasks.errors import BudgetExhausted
    from recall_tasks.io.results import ResultStore
    from recall_tasks.io.storage import StorageConfig
    from recall_tasks.pipeline.flow import recall_benchmark

    data = write_parquet(tmp_path / "eval.parquet", make_rows(COST_ROWS, seed=11), row_group_size=10)
    chunks_in_flight, chunk_rows, concurrency = 2, 10, 2
    run_ids: dict[str, str] = {}
    for runner in ("processes", "threads"):
        out = str(tmp_path / runner)
        with pytest.raises(BudgetExhausted) as stopped:
            recall_benchmark(
                RunParams(
                    dataset_uri=data,
                    output_uri=out,
                    judge="openai",
                    base_url=judge_env.base_url,
                    max_cost_usd=COST_BUDGET,
                    chunk_size=chunk_rows,
                    max_workers=chunks_in_flight,
                    max_concurrency=concurrency,
                    task_runner=runner,
                    workers=2 if runner == "processes" else None,
                    baseline=None,
                )
            )
        summary = stopped.value.summary
        assert summary["status"] == "budget_exhausted", (runner, summary["status_reason"])
        run_ids[runner] = summary["run_id"]
        whole = ", the whole run" if runner == "processes" else ""
        reason = f"cost budget reached (--max-cost-usd {COST_BUDGET:g}{whole})"
        assert summary["status_reason"] and reason in summary["status_reason"], (runner, summary["status_reason"])
        store = ResultStore(out, StorageConfig.from_options(), "delta")
        rows = store.read_table("results").to_table().to_pylist()
        (run,) = [r for r in store.read_table("runs").to_table().to_pylist() if r["segment_column"] is None]
        judged = [r for r in rows if r["score"] is not None]
        kept = [r for r in rows if r["score"] is None]  # rows past the budget
        assert len(rows) == COST_ROWS and kept and all(r["reason"] == "not judged: " + reason for r in kept), runner
        assert all(r["requests"] == 0 and not r["cost_usd"] for r in kept), runner
        costs = [r["cost_usd"] for r in judged]
        assert run["cost_usd"] == pytest.approx(sum(costs)) == summary["cost_usd"]
        # never exceeded (each attempt reserved its worst case first; before, the calls in flight when the budget
        # was reached were paid on top of it), and most of it spent
        assert COST_BUDGET / 3 <= run["cost_usd"] <= COST_BUDGET, (runner, run["cost_usd"], len(judged))
    with get_client(sync_client=True) as client:  # the run's counter went with the commit
        names = [lim.name for lim in client.read_global_concurrency_limits(limit=200)]
    assert not [n for n in names if n.startswith(f"recall-bench-cost-{run_ids['processes']}")]


@pytest.fixture
def judge_env(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    return fake_openai
