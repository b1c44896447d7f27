"""Issue 58.1: a deployment's flow run names no code, no endpoint and no storage the worker did not allow.

The flow runs for real: a deployment on the test Prefect server, a flow run created from it as the UI, ``prefect
deployment run --param`` or a trigger would, executed by Prefect's flow engine in this process (what a worker's
runner does in its subprocess). The command line keeps every option (the last test).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError
from recall_tasks.pipeline import trust
from recall_tasks.pipeline.trust import WorkerPolicy, check_flow_run

REPO = Path(__file__).resolve().parents[1]


def policy(cwd: str = "/srv/recall", **env: str) -> WorkerPolicy:
    names = {"callables": "RECALL_BENCH_ALLOW_CALLABLES", "endpoints": "RECALL_BENCH_ALLOW_ENDPOINTS",
             "storage": "RECALL_BENCH_ALLOW_STORAGE"}  # fmt: skip
    saved = {v: os.environ.pop(v, None) for v in [*names.values(), "OPENAI_BASE_URL", "AWS_ENDPOINT_URL"]}
    try:
        os.environ.update({names[k]: v for k, v in env.items()})
        return WorkerPolicy.from_environment(cwd=cwd)
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def params(**kw: Any) -> RunParams:
    kw.setdefault("dataset_uri", "s3://evals/golden.parquet")
    kw.setdefault("output_uri", "s3://evals/recall")
    return RunParams(**kw)


@pytest.mark.parametrize(
    ("given", "refused"),
    [
        ({"retriever": "subprocess:getoutput"}, "parameter retriever names code to run"),
        ({"context_extractor": "os:system"}, "parameter context_extractor names code to run"),
        ({"base_url": "http://attacker.example/v1"}, "base_url names an endpoint the worker does not allow"),
        ({"dask_address": "tcp://attacker.example:8786", "task_runner": "dask"}, "dask_address names an endpoint"),
        ({"storage_options": {"endpoint_url": "http://attacker.example"}}, "storage option endpoint_url"),
        ({"storage_options": {"client_kwargs": "{}"}}, "storage option client_kwargs is refused"),
        ({"dataset_uri": "http://attacker.example/data.jsonl"}, "dataset_uri names http:// storage"),
        ({"dataset_uri": "memory://x.parquet"}, "dataset_uri names memory:// storage"),
        ({"output_uri": "/etc/recall"}, "output_uri names a local path outside the allowed folders"),
        ({"qrels_uri": "/etc/shadow"}, "qrels_uri names a local path outside"),
        ({"cache_uri": "file:///srv/recall/../../etc"}, "cache_uri names a local path outside"),
        ({"canary": "/srv/recall-other/canary.jsonl"}, "canary names a local path outside"),
    ],
)
def test_default_worker_settings_refuse_what_a_flow_run_may_not_name(given, refused):
    with pytest.raises(ConfigError, match=refused) as info:
        check_flow_run(params(**given), policy())
    assert "attacker.example/v1" not in str(info.value)  # an endpoint is named by its host only
    assert "docs/security.md" in str(info.value)


@pytest.mark.parametrize(
    "given",
    [
        {},
        {"dataset_uri": "gs://b/x.parquet", "output_uri": "az://c/out"},
        {"dataset_uri": "{here}/data/golden.parquet", "output_uri": "recall-output"},
        {"storage_options": {"region": "eu-west-1", "read_timeout": "30"}},
    ],
)
def test_default_worker_settings_keep_the_shipped_deployments_kind_of_run(given, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the worker's folder; a relative output resolves against it
    given = {k: v.format(here=tmp_path) if isinstance(v, str) else v for k, v in given.items()}
    check_flow_run(params(**given), policy(cwd=str(tmp_path)))


def test_what_the_worker_allows_a_flow_run_may_name():
    allowing = policy(
        callables="tests.sample_retriever:retrieve,mypkg.extract:*",
        endpoints="https://llm.internal/v1,tcp://dask.internal:8786",
        storage="s3://evals/team-a,/data/evals",
    )
    check_flow_run(
        params(
            retriever="tests.sample_retriever:retrieve",
            context_extractor="mypkg.extract:from_messages",
            base_url="https://LLM.internal/v1/",
            dataset_uri="s3://evals/team-a/golden.parquet",
            output_uri="/data/evals/out",
            storage_options={"endpoint_url": "https://llm.internal/v1/s3"},
        ),
        allowing,
    )
    with pytest.raises(ConfigError, match="dataset_uri names s3:// storage"):  # another prefix of the same bucket
        check_flow_run(params(dataset_uri="s3://evals/team-ab/x.parquet", output_uri="/data/evals/o"), allowing)
    with pytest.raises(ConfigError, match="retriever names code"):
        check_flow_run(params(retriever="tests.sample_retriever:broken", output_uri="/data/evals/o",
                              dataset_uri="s3://evals/team-a/g.parquet"), allowing)  # fmt: skip


def test_the_workers_own_endpoints_are_allowed(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:8333")
    own = WorkerPolicy.from_environment(cwd="/srv/recall")
    check_flow_run(
        params(base_url="http://127.0.0.1:8000/v1", storage_options={"endpoint_url": "http://127.0.0.1:8333"}), own
    )


# ------------------------------------------------------------------------------ real deployment flow runs


@pytest.fixture
def deployment(prefect_harness):
    """A deployment of the benchmark flow on the test server; returns a function creating and running its runs."""
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow

    from recall_tasks.pipeline.flow import recall_benchmark

    with get_client(sync_client=True) as client:
        flow_id = client.create_flow(recall_benchmark)
        deployment_id = client.create_deployment(
            flow_id=flow_id, name="trust-test", entrypoint="flows/recall_flow.py:recall_benchmark"
        )

    def start(params: dict[str, Any]) -> Any:
        with get_client(sync_client=True) as client:
            flow_run = client.create_flow_run_from_deployment(deployment_id, parameters={"params": params})
        state = run_flow(recall_benchmark, flow_run=flow_run, parameters={"params": params}, return_type="state")
        with get_client(sync_client=True) as client:
            return state, client.read_flow_run(flow_run.id)

    return start


def _dataset(path: Path, question: str) -> str:
    row = {"row_id": "r1", "input": question, "expected_output": "Paris is in France.", "retrieval_context": []}
    pq.write_table(pa.Table.from_pylist([row]), path)
    return str(path)


def test_a_flow_run_naming_a_shell_as_retriever_runs_nothing(deployment, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the worker's folder: the dataset and output are under it
    marker = tmp_path / "retriever-ran"
    data = _dataset(tmp_path / "golden.parquet", f"touch {marker}")
    state, flow_run = deployment(
        {"dataset_uri": data, "output_uri": str(tmp_path / "out"), "retriever": "subprocess:getoutput"}
    )
    assert state.is_failed() and flow_run.deployment_id is not None
    assert "parameter retriever names code to run on the worker" in str(state.message)
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_a_flow_run_naming_another_endpoint_never_sends_it_the_key(deployment, fake_openai, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-worker-secret-0123456789")
    data = _dataset(tmp_path / "golden.parquet", "Where is Paris?")
    state, _ = deployment(
        {"dataset_uri": data, "output_uri": str(tmp_path / "out"), "judge": "openai", "base_url": fake_openai.base_url}
    )
    assert state.is_failed() and "base_url names an endpoint the worker does not allow" in str(state.message)
    assert fake_openai.requests == []  # not even the pre-flight probe: no Authorization header left the worker


def test_a_flow_run_within_the_workers_leave_runs(deployment, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from tests import sample_retriever

    monkeypatch.setenv("RECALL_BENCH_ALLOW_CALLABLES", "tests.sample_retriever:retrieve")
    monkeypatch.setitem(sample_retriever.INDEX, "Where is Paris?", ["Paris is in France."])
    data = _dataset(tmp_path / "golden.parquet", "Where is Paris?")
    state, _ = deployment({"dataset_uri": data, "output_uri": "out", "retriever": "tests.sample_retriever:retrieve"})
    assert state.is_completed(), state.message
    assert state.result()["rows"] == 1 and (tmp_path / "out" / "runs").exists()


def test_the_command_line_keeps_every_option(prefect_harness, tmp_path, monkeypatch):
    """``recall-bench run`` is the worker's own user: a retriever and a path anywhere are its business."""
    from typer.testing import CliRunner

    from recall_tasks.cli.app import app
    from tests import sample_retriever

    monkeypatch.setitem(sample_retriever.INDEX, "Where is Paris?", ["Paris is in France."])
    data = _dataset(tmp_path / "golden.parquet", "Where is Paris?")
    result = CliRunner().invoke(
        app, ["run", data, "-o", str(tmp_path / "elsewhere" / "out"), "--retriever", "tests.sample_retriever:retrieve"]
    )
    assert result.exit_code == 0, result.output
    assert trust.SECURITY_DOC not in result.output
