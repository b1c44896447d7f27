"""``emit-index-built`` says what the server will do with the event: no deployment to act on it, no worker of its
pool online (the run waits as Scheduled), or how many workers will pick it up; against the test Prefect server, a
work pool and deployment created through its API and a worker's heartbeat (what a running worker sends)."""

from __future__ import annotations

import uuid

from typer.testing import CliRunner

from recall_tasks.cli import app as cli
from recall_tasks.pipeline import events


def test_the_readiness_sentence_follows_the_server(prefect_harness) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    tag = uuid.uuid4().hex[:8]  # the session's server is shared: names of this test's own
    pool, deployment = f"pool-{tag}", f"index-{tag}"
    assert events.trigger_readiness(f"recall-benchmark/{deployment}") == (
        f"this server has no deployment recall-benchmark/{deployment}: the event starts no run until it is deployed"
    )
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        flow_id = client.create_flow_from_name("recall-benchmark")
        client.create_deployment(flow_id=flow_id, name=deployment, work_pool_name=pool)
        idle = events.trigger_readiness(f"recall-benchmark/{deployment}")
        assert idle is not None and f"no worker of {pool} is online, so it waits as Scheduled" in idle, idle
        assert f"prefect worker start --pool {pool}" in idle
        client.send_worker_heartbeat(pool, f"worker-{tag}", heartbeat_interval_seconds=60)
    ready = events.trigger_readiness(f"recall-benchmark/{deployment}")
    assert ready is not None and f"which the 1 worker(s) of {pool} online pick up within seconds" in ready, ready


def test_emit_index_built_prints_it_after_the_event_id(prefect_harness) -> None:
    done = CliRunner().invoke(
        cli.app, ["emit-index-built", "--index-version", "v9", "--dataset", "s3://b/golden.parquet"]
    )
    assert done.exit_code == 0, done.output
    said = done.stderr
    assert "this server has no deployment recall-benchmark/index-built-recall" in said, said
    assert "none running" not in said and "recall-golden.parquet-index-v9" in said, said
