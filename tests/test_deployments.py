"""deployments/prefect.yaml for real: a Prefect server, `prefect deploy`, a process worker, events, SeaweedFS.

No mocks: `prefect deploy --prefect-file deployments/prefect.yaml --all` runs as a subprocess against a real
``prefect server start``; the schedule, concurrency limit and trigger are read back through the API; then
``search.index.built`` is sent four ways (``recall-bench emit-index-built``, :func:`emit_index_built`,
the documented ``prefect event emit`` line and its ``--resource-id`` shorthand) and each must produce a
completed flow run of ``index-built-recall`` on the worker, with the parameters templated from the event,
and a row in the ``runs`` Delta table on S3; an event without ``dataset_uri`` must start nothing. The
lexical judge is chosen through the event payload, so no OpenAI key is needed (the worker has none).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
import yaml
from deltalake import DeltaTable
from typer.testing import CliRunner

from recall_tasks.config import RunParams
from recall_tasks.io.storage import StorageConfig, delta_storage_options
from recall_tasks.pipeline import events
from recall_tasks.secrets import looks_secret
from tests import prefect_server as _prefect
from tests.prefect_server import REPO, PrefectServer, PrefectWorker, clean_env
from tests.s3_server import S3Server, closed_port

prefect_server = _prefect.prefect_server
prefect_worker = _prefect.prefect_worker

YAML = REPO / "deployments" / "prefect.yaml"
FLOW = "recall-benchmark"
RUN_TIMEOUT_S = 180.0
#: how long the failed action of an event without dataset_uri may take to show as an event (persisted in batches)
FAILURE_EVENT_TIMEOUT_S = 60.0
FINAL_BAD = {"FAILED", "CRASHED", "CANCELLED"}
PULL_STEP = {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $RECALL_BENCH_HOME }}"}}

# A tiny program that is `recall-bench` as far as the new command goes: events.register on a Typer app.
CLI_PROGRAM = (
    "import typer\n"
    "from recall_tasks.pipeline import events\n"
    "app = typer.Typer()\n"
    "app.callback()(lambda: None)\n"
    "events.register(app)\n"
    "app()\n"
)
EMIT_PROGRAM = (
    "import json, sys\n"
    "from recall_tasks.pipeline.events import emit_index_built\n"
    "kw = json.loads(sys.argv[1])\n"
    "event = emit_index_built(kw.pop('index_version'), kw.pop('dataset_uri'), **kw)\n"
    "print(event.id if event else 'NONE')\n"
)


def _rows(n: int = 10) -> list[dict[str, Any]]:
    facts = [
        ("Paris is the capital of France.", "Paris is the capital and largest city of France."),
        ("Water boils at 100 degrees Celsius.", "At sea level water boils at 100 degrees Celsius."),
        ("The Nile flows into the Mediterranean Sea.", "The Nile river flows north into the Mediterranean Sea."),
        ("Einstein was born in 1879.", "Albert Einstein was born in Ulm in 1879."),
        ("The moon orbits the Earth.", "Unrelated text about cooking pasta."),
    ]
    return [
        {
            "row_id": f"r{i:03d}",
            "question": f"Question {i}?",
            "ground_truth": facts[i % len(facts)][0],
            "contexts": [facts[i % len(facts)][1], "filler chunk"],
            "category": "ab"[i % 2],
        }
        for i in range(n)
    ]


def _upload_parquet(s3: S3Server, bucket: str, key: str, rows: list[dict[str, Any]], tmp: Path) -> str:
    local = tmp / key.replace("/", "_")
    pq.write_table(pa.Table.from_pylist(rows), local)
    s3.client().upload_file(str(local), bucket, key)
    return f"s3://{bucket}/{key}"


def _runs_table(uri: str, s3: S3Server) -> list[dict[str, Any]]:
    runs = f"{uri}/runs"
    opts = delta_storage_options(runs, StorageConfig.from_options(env=s3.env()))
    return DeltaTable(runs, storage_options=opts).to_pyarrow_table().to_pylist()


def _python(
    code: str, *args: str, server: PrefectServer, api: bool = True, api_url: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code args`` from the repo root, against ``server`` (or ``api_url``, or no API at all)."""
    env = server.env(PYTHONPATH=str(REPO)) if api else clean_env(PYTHONPATH=str(REPO), PREFECT_HOME=str(server.home))
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )


def _event_id(done: subprocess.CompletedProcess[str], what: str) -> str:
    assert done.returncode == 0, f"{what} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    match = re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", done.stdout)
    assert match, f"{what} printed no event id:\n{done.stdout}\n{done.stderr}"
    return match.group(0)


# --------------------------------------------------------------------------------------------- static checks


def test_yaml_is_portable_and_holds_no_secrets():
    from prefect.cli.deploy._models import PrefectYamlModel

    raw = yaml.safe_load(YAML.read_text())
    model = PrefectYamlModel.model_validate(raw)
    names = {d.name: d for d in model.deployments}
    maintenance = names.pop("nightly-maintenance")
    assert set(names) == {"nightly-recall", "index-built-recall", "nightly-recall-batch-wait", "nightly-recall-batch"}
    assert maintenance.entrypoint == "flows/recall_flow.py:maintain_tables"
    assert maintenance.parameters == {"output_uri": "{{ $RECALL_OUTPUT_URI }}", "keep_days": 7}
    (nightly_maintenance,) = maintenance.schedules or []
    assert nightly_maintenance.active is False  # optional: switched on by the user
    assert maintenance.work_pool is not None and maintenance.work_pool.job_variables == {}
    for dep in names.values():
        assert dep.entrypoint == "flows/recall_flow.py:recall_benchmark"
        assert dep.work_pool is not None and dep.work_pool.name == "recall-pool"
        assert dep.work_pool.job_variables == {}  # no env: secrets come from the worker's environment
    assert model.pull == [PULL_STEP]
    env_vars = set(re.findall(r"\{\{\s*\$(\w+)\s*\}\}", json.dumps(raw)))
    assert env_vars == {"RECALL_BENCH_HOME", "RECALL_DATASET_URI", "RECALL_OUTPUT_URI"}

    def walk(node: Any, path: str = "") -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                assert not (looks_secret(str(key)) and key != "prefect.resource.id"), f"secret-looking key {path}{key}"
                walk(value, f"{path}{key}.")
        elif isinstance(node, list):
            for item in node:
                walk(item, path)
        elif isinstance(node, str):
            assert not re.search(r"sk-[A-Za-z0-9]{8,}|AKIA[0-9A-Z]{12}", node), f"credential-like value at {path}"

    walk(raw)
    # the nightly parameters validate as RunParams once the environment is filled in
    params = names["nightly-recall"].parameters["params"]
    filled = {
        k: v.replace("{{ $RECALL_DATASET_URI }}", "s3://b/d.parquet") if isinstance(v, str) else v
        for k, v in params.items()
    }
    filled["output_uri"] = "s3://b/recall"
    assert RunParams.model_validate(filled).judge == "openai"

    # the two batch examples: every parameter set (the deployment's and each schedule's) is a valid RunParams
    def run_params(params: dict[str, Any]) -> RunParams:
        env = {"{{ $RECALL_DATASET_URI }}": "s3://b/d.parquet", "{{ $RECALL_OUTPUT_URI }}": "s3://b/recall"}
        return RunParams.model_validate({k: env.get(v, v) if isinstance(v, str) else v for k, v in params.items()})

    wait = names["nightly-recall-batch-wait"]
    waiting = run_params(wait.parameters["params"])
    assert waiting.batch and waiting.batch_wait and waiting.poll_interval_s == 300
    (only,) = wait.schedules or []
    assert not only.parameters and only.active is False
    split = names["nightly-recall-batch"]
    submit, collect = split.schedules or []
    assert submit.active is False and collect.active is False and not submit.parameters
    submitting = run_params(split.parameters["params"])
    collecting = run_params(collect.parameters["params"])
    assert submitting.batch and not submitting.batch_wait and not submitting.batch_collect_only
    assert collecting.batch_collect_only  # the same parameters otherwise: the same run key, the same batches
    assert collecting.model_copy(update={"batch_collect_only": False}) == submitting
    assert waiting.label != submitting.label  # the two examples never share a run key (and so batches)


def test_event_helpers_and_cli_command(prefect_server: PrefectServer):
    assert events.index_resource("2026.11.30") == {
        "prefect.resource.id": "search.index.2026.11.30",
        "search.index.version": "2026.11.30",
    }
    for bad in ("", " v1", "v 1", "../x", "x" * 200):
        with pytest.raises(ValueError, match="index version"):
            events.index_resource(bad)
    assert events.index_built_payload("s3://b/d.parquet") == {"dataset_uri": "s3://b/d.parquet"}
    with pytest.raises(ValueError, match="looks secret"):
        events.index_built_payload("s3://b/d.parquet", extra={"api_key": "x"})
    with pytest.raises(ValueError, match="own argument"):
        events.index_built_payload("s3://b/d.parquet", extra={"output_uri": "x"})
    with pytest.raises(ValueError, match="dataset_uri"):
        events.index_built_payload("  ")
    argv = shlex.split(events.PREFECT_EVENT_EMIT_EXAMPLE)
    assert argv[:4] == ["prefect", "event", "emit", "search.index.built"]
    assert json.loads(argv[argv.index("--resource") + 1])["search.index.version"] == "2026-11-30"
    assert set(json.loads(argv[argv.index("--payload") + 1])) == {"dataset_uri", "retrieval_uri", "output_uri"}

    app = typer.Typer()
    app.callback()(lambda: None)
    events.register(app)
    result = CliRunner().invoke(app, ["emit-index-built", "--help"])
    assert result.exit_code == 0, result.output
    for option in ("--index-version", "--dataset", "--retrieval-uri", "--output", "--extra"):
        assert option in result.output

    # without PREFECT_API_URL nothing is sent (no ephemeral server swallowing the event)
    cmd = ["emit-index-built", "--index-version", "v1", "--dataset", "s3://b/d"]
    no_api = _python(CLI_PROGRAM, *cmd, server=prefect_server, api=False)
    assert no_api.returncode == 2 and "PREFECT_API_URL" in no_api.stderr, no_api.stderr
    kwargs = json.dumps({"index_version": "v1", "dataset_uri": "s3://b/d"})
    none = _python(EMIT_PROGRAM, kwargs, server=prefect_server, api=False)
    assert none.returncode == 0 and none.stdout.strip() == "NONE", none.stderr
    bad = _python(CLI_PROGRAM, *cmd[:2], "v 1", *cmd[3:], server=prefect_server)
    assert bad.returncode == 2 and "index version" in bad.stderr, bad.stderr
    # an unreachable server is an error, not a silently lost event
    down = _python(CLI_PROGRAM, *cmd, server=prefect_server, api_url=f"http://127.0.0.1:{closed_port()}/api")
    assert down.returncode == 1 and "could not send the event" in down.stderr, down.stderr


# ------------------------------------------------------------------------------------------------ end to end


@pytest.mark.timeout(480)  # 4 event runs and the maintenance run on one worker: 299 s at load 15 (5 min default)
def test_deploy_then_index_built_events_run_the_flow(
    prefect_server: PrefectServer, prefect_worker: PrefectWorker, s3_server: S3Server, tmp_path: Path
):
    t_start = time.monotonic()
    timings: dict[str, float] = {"server start": prefect_server.startup_seconds or 0.0}
    timings["worker start"] = prefect_worker.startup_seconds or 0.0
    bucket = s3_server.make_bucket()
    rows = _rows(10)
    dataset = _upload_parquet(s3_server, bucket, "golden/eval.parquet", rows, tmp_path)
    retrieval = _upload_parquet(
        s3_server, bucket, "index/retrieval.parquet",
        [{"row_id": r["row_id"], "retrieval_context": r["contexts"]} for r in rows], tmp_path,
    )  # fmt: skip
    default_output = f"s3://{bucket}/recall"

    # ---- deploy the real yaml; the deploying shell fills in the nightly's dataset and the default output
    t0 = time.monotonic()
    deployed = prefect_server.cli(
        "deploy", "--prefect-file", "deployments/prefect.yaml", "--all",
        env={"RECALL_DATASET_URI": dataset, "RECALL_OUTPUT_URI": default_output},
    )  # fmt: skip
    timings["prefect deploy --all"] = time.monotonic() - t0
    assert "nightly-recall" in deployed.stdout and "index-built-recall" in deployed.stdout, deployed.stdout
    t0 = time.monotonic()  # deploying again updates in place: one schedule, one trigger
    prefect_server.cli(
        "deploy", "--prefect-file", "deployments/prefect.yaml", "--all",
        env={"RECALL_DATASET_URI": dataset, "RECALL_OUTPUT_URI": default_output},
    )  # fmt: skip
    timings["prefect deploy --all (again)"] = time.monotonic() - t0

    with prefect_server.client() as client:
        nightly = client.read_deployment_by_name(f"{FLOW}/nightly-recall")
        index = client.read_deployment_by_name(f"{FLOW}/index-built-recall")
        for dep in (nightly, index):
            assert dep.entrypoint == "flows/recall_flow.py:recall_benchmark"
            assert dep.work_pool_name == "recall-pool"
            # the checkout is chosen on the worker at run time: the placeholder is stored as written
            assert dep.pull_steps == [PULL_STEP]
        assert nightly.parameters == {
            "params": {
                "dataset_uri": dataset,
                "output_uri": default_output,
                "judge": "openai",
                "label": "nightly",
                "timeout_s": 60,
                "max_retries": 4,
            }
        }
        RunParams.model_validate(nightly.parameters["params"])
        assert len(nightly.schedules) == 1
        schedule = nightly.schedules[0]
        assert schedule.active
        assert schedule.schedule.cron == "0 2 * * *" and schedule.schedule.timezone == "Europe/Berlin"
        gcl = nightly.global_concurrency_limit
        assert (gcl.limit if gcl else nightly.concurrency_limit) == 1
        assert not index.schedules

        # the batch examples: deployed paused; the collect schedule holds the same parameters plus collect-only
        batch_wait = client.read_deployment_by_name(f"{FLOW}/nightly-recall-batch-wait")
        batch_split = client.read_deployment_by_name(f"{FLOW}/nightly-recall-batch")
        waiting = RunParams.model_validate(batch_wait.parameters["params"])
        assert waiting.batch and waiting.batch_wait and waiting.dataset_uri == dataset
        assert [s.active for s in batch_wait.schedules] == [False]
        submit, collect = sorted(batch_split.schedules, key=lambda s: bool(s.parameters))
        assert not submit.active and not collect.active and not submit.parameters
        assert batch_split.parameters["params"]["dataset_uri"] == dataset
        assert collect.parameters == {"params": {**batch_split.parameters["params"], "batch_collect_only": True}}
        assert RunParams.model_validate(collect.parameters["params"]).output_uri == default_output

        automations = client.read_resource_related_automations(f"prefect.deployment.{index.id}")
        assert len(automations) == 1
        automation = automations[0]
        assert automation.enabled
        trigger = automation.trigger
        assert trigger.type == "event" and set(trigger.expect) == {"search.index.built"}
        assert trigger.match.model_dump() == {"prefect.resource.id": "search.index.*"}
        (action,) = automation.actions
        assert action.type == "run-deployment" and action.deployment_id == index.id
        templated = action.parameters["params"]
        assert templated["dataset_uri"] == "{{ event.payload.dataset_uri }}"
        assert templated["output_uri"] == f"{{{{ (event.payload.output_uri or '{default_output}') }}}}"
        assert not client.read_resource_related_automations(f"prefect.deployment.{nightly.id}")

        # the real scheduler plans the nightly runs at 02:00 Berlin time
        deadline = time.monotonic() + 30
        scheduled = []
        while time.monotonic() < deadline and not scheduled:
            scheduled = _deployment_runs(client, nightly.id)
            time.sleep(0.5)
        assert scheduled, "the scheduler planned no nightly run"
        for run in scheduled:
            local = run.expected_start_time.astimezone(ZoneInfo("Europe/Berlin"))
            assert (local.hour, local.minute) == (2, 0), local
            assert run.expected_start_time > dt.datetime.now(dt.UTC)

    # ---- announce four index builds, four ways
    tag = uuid.uuid4().hex[:6]
    v_cli, v_lib, v_doc, v_short = f"{tag}-cli", f"2026.11.{tag}", f"{tag}-doc", f"{tag}-short"
    t0 = time.monotonic()
    ids: dict[str, str] = {}
    sent: dict[str, float] = {}
    ids[v_cli] = _event_id(
        _python(
            CLI_PROGRAM, "emit-index-built", "--index-version", v_cli, "--dataset", dataset,
            "--output", f"s3://{bucket}/out-cli", "--extra", "judge=lexical", server=prefect_server,
        ),
        "recall-bench emit-index-built",
    )  # fmt: skip
    sent[v_cli] = time.monotonic()
    lib_kwargs = {
        "index_version": v_lib, "dataset_uri": dataset, "retrieval_uri": retrieval,
        "output_uri": f"s3://{bucket}/out-lib", "extra": {"judge": "lexical"},
    }  # fmt: skip
    ids[v_lib] = _event_id(_python(EMIT_PROGRAM, json.dumps(lib_kwargs), server=prefect_server), "emit_index_built")
    sent[v_lib] = time.monotonic()
    doc_args = events.prefect_event_emit_args(v_doc, dataset, extra={"judge": "lexical"})  # default output
    assert shlex.join(doc_args).startswith("prefect event emit search.index.built --resource '{")
    ids[v_doc] = _event_id(prefect_server.cli(*doc_args[1:]), "prefect event emit")
    sent[v_doc] = time.monotonic()
    short_payload = json.dumps({"dataset_uri": dataset, "output_uri": f"s3://{bucket}/out-short", "judge": "lexical"})
    ids[v_short] = _event_id(
        prefect_server.cli(
            "event",
            "emit",
            "search.index.built",
            "--resource-id",
            f"search.index.{v_short}",
            "--payload",
            short_payload,
        ),  # fmt: skip
        "prefect event emit --resource-id",
    )
    sent[v_short] = time.monotonic()
    timings["emit 4 events"] = time.monotonic() - t0
    # an event without dataset_uri starts no run: the action fails and says why
    prefect_server.cli("event", "emit", "search.index.built", "--resource-id", f"search.index.{tag}-bad")
    expected = {
        v_cli: {"output_uri": f"s3://{bucket}/out-cli", "retrieval_uri": None},
        v_lib: {"output_uri": f"s3://{bucket}/out-lib", "retrieval_uri": retrieval},
        v_doc: {"output_uri": default_output, "retrieval_uri": None},
        v_short: {"output_uri": f"s3://{bucket}/out-short", "retrieval_uri": None},
    }

    # ---- wait for one completed run per event
    runs, finished = _wait_for_runs(prefect_server, prefect_worker, index.id, set(expected), t0)
    timings["emit start -> 4 runs done"] = time.monotonic() - t0
    how = {
        v_cli: "emit-index-built",
        v_lib: "emit_index_built()",
        v_doc: "prefect event emit",
        v_short: "--resource-id",
    }
    for version, name in how.items():
        timings[f"event -> completed: {name}"] = finished[version] - sent[version]
    for version, run in runs.items():
        params = run.parameters["params"]
        assert params["dataset_uri"] == dataset
        assert params["index_version"] == version and params["label"] == f"index-{version}"
        assert params["judge"] == "lexical"
        assert params["output_uri"] == expected[version]["output_uri"]
        assert params.get("retrieval_uri") == expected[version]["retrieval_uri"]  # never "" or "None"
        RunParams.model_validate(params)
        assert run.name == f"recall-eval.parquet-index-{version}"

        table = _runs_table(expected[version]["output_uri"], s3_server)
        mine = [r for r in table if r["label"] == f"index-{version}" and r["segment_column"] is None]
        assert len(mine) == 1, table
        assert mine[0]["index_version"] == version and mine[0]["rows"] == 10 and mine[0]["dataset_uri"] == dataset
        assert mine[0]["flow_run_id"] == str(run.id)
    assert _automation_failures_within(prefect_server, FAILURE_EVENT_TIMEOUT_S), (
        "the event without dataset_uri did not fail its action"
    )

    # ---- the optional maintenance step, run once by the worker on the default output (Delta on SeaweedFS)
    def rows_of(output: str) -> list[dict[str, Any]]:
        return sorted(_runs_table(output, s3_server), key=lambda r: (r["run_id"], str(r["segment_value"])))

    before = rows_of(default_output)
    t0 = time.monotonic()
    with prefect_server.client() as client:
        maintenance = client.read_deployment_by_name("maintain-recall-tables/nightly-maintenance")
        assert maintenance.parameters == {"output_uri": default_output, "keep_days": 7}
        assert [s.active for s in maintenance.schedules] == [False]
        started = client.create_flow_run_from_deployment(maintenance.id)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        with prefect_server.client() as client:
            state = client.read_flow_run(started.id).state
        if state is not None and state.is_final():
            break
        assert time.monotonic() < deadline, f"maintenance run not done: {state}\n{prefect_worker.log_tail(80)}"
        time.sleep(1.0)
    assert state.is_completed(), f"{state.message}\n{prefect_worker.log_tail(80)}"
    assert rows_of(default_output) == before  # the same rows, compacted and checkpointed
    timings["maintenance deployment run"] = time.monotonic() - t0
    timings["total"] = time.monotonic() - t_start
    print("\n" + "\n".join(f"  {name:<38} {seconds:6.1f} s" for name, seconds in timings.items()))
    print(f"  event ids: {ids}")


def _deployment_runs(client: Any, deployment_id: Any) -> list[Any]:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))


def _automation_failures_within(server: PrefectServer, timeout_s: float) -> list[str]:
    """The failed actions' reasons, polled until there is one or ``timeout_s`` passed: the actions service emits
    the failure as an event, and the event persister writes events in batches, so it may land after the runs of
    the events sent before it (seen once in a clean-clone run at load 11)."""
    deadline = time.monotonic() + timeout_s
    while not (failures := server.automation_failures()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return failures


def _wait_for_runs(
    server: PrefectServer, worker: PrefectWorker, deployment_id: Any, versions: set[str], t0: float
) -> tuple[dict[str, Any], dict[str, float]]:
    """Poll until every version has a COMPLETED run; returns the runs and when each was first seen done."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    seen: dict[str, str] = {}
    finished: dict[str, float] = {}
    while True:
        with server.client() as client:
            runs = _deployment_runs(client, deployment_id)
        by_version = {r.parameters.get("params", {}).get("index_version"): r for r in runs}
        for version, run in by_version.items():
            state = run.state.type.value if run.state else "?"
            if seen.get(version) != state:
                seen[version] = state
                if state == "COMPLETED":
                    finished[version] = time.monotonic()
                print(f"  [{time.monotonic() - t0:5.1f} s] run of {version}: {state}")
            if state in FINAL_BAD:
                pytest.fail(f"flow run for {version} ended {state}: {run.state.message}\n{worker.log_tail(150)}")
        done = {v: r for v, r in by_version.items() if v in versions and r.state and r.state.is_completed()}
        if len(done) == len(versions):
            assert len(runs) == len(versions), f"unexpected extra runs: {[r.parameters for r in runs]}"
            return done, finished
        if time.monotonic() > deadline:
            pytest.fail(
                f"after {RUN_TIMEOUT_S} s: runs {seen}, expected {sorted(versions)}\n"
                f"failed automation actions: {server.automation_failures()}\n"
                f"--- worker log\n{worker.log_tail(150)}\n--- server log\n{server.log_tail(60)}"
            )
        time.sleep(1.0)
