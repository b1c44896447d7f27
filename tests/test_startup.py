"""What keeps an ad-hoc run's start-up short, checked structurally (speed itself is in benchmarks/startup.py)."""

from __future__ import annotations

import subprocess
import sys

from prefect import Flow

from recall_tasks.config import RunParams
from recall_tasks.pipeline.flow import recall_benchmark
from tests.prefect_server import REPO, clean_env


def test_cli_and_server_commands_import_neither_prefect_nor_openai():
    code = (
        "import sys, recall_tasks.cli.app, recall_tasks.cli.server, recall_tasks\n"
        "heavy = sorted(m for m in ('prefect', 'openai', 'fastapi', 'duckdb', 'deltalake') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        "recall_tasks.LexicalJudge\n"
        "assert 'openai' not in sys.modules\n"
        "recall_tasks.OpenAIJudge\n"
        "assert 'openai' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=clean_env(PYTHONPATH=str(REPO)), capture_output=True)
    assert done.returncode == 0, done.stderr.decode()


def test_flow_parameters_are_serialised_as_prefect_would_without_fastapi():
    params = RunParams(
        dataset_uri="s3://bucket/eval.parquet", segment_by=["category"], columns={"input": "question"},
        storage_options={"endpoint_url": "http://localhost:8333"}, max_cost_usd=1.5, baseline=None,
    )  # fmt: skip
    ours = recall_benchmark.serialize_parameters({"params": params})
    assert ours == Flow.serialize_parameters(recall_benchmark, {"params": params})
    assert ours["params"]["storage_options"] == {"endpoint_url": "http://localhost:8333"}
    as_dict = {"params": {"dataset_uri": "x.parquet", "label": None}}  # a deployment's parameters
    assert recall_benchmark.serialize_parameters(as_dict) == as_dict
