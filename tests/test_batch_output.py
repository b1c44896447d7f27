"""``--batch`` output: progress at INFO (not WARNING), and the budget line's cost is the batch's real bound."""

from __future__ import annotations

import logging
import re

import pytest

from recall_tasks.config import RunParams
from recall_tasks.pipeline.flow import recall_benchmark
from tests import s3_server as _s3
from tests.test_batch import judge_env  # noqa: F401 - a fixture
from tests.test_batch_race import s3_output  # noqa: F401 - a fixture
from tests.test_pipeline import make_rows, write_parquet

s3_server = _s3.s3_server
s3_bucket = _s3.s3_bucket


@pytest.mark.concurrency
def test_batch_progress_is_info_and_the_budget_line_names_a_cost(prefect_harness, judge_env, tmp_path, caplog) -> None:  # noqa: F811
    data = write_parquet(tmp_path / "eval.parquet", make_rows(10, seed=73))
    judge_env.batch_hold = True
    params = RunParams(dataset_uri=data, output_uri=str(tmp_path / "out"), judge="openai",
                       base_url=judge_env.base_url, batch=True, max_requests=4)  # fmt: skip
    with caplog.at_level(logging.INFO, logger="recall_tasks.pipeline.batch"):
        assert recall_benchmark(params)["status"] == "batch_pending"
    submitted = [r for r in caplog.records if r.getMessage().startswith("submitted batch")]
    assert submitted and all(r.levelno == logging.INFO for r in submitted)
    (budget,) = [r.getMessage() for r in caplog.records if "into the batch" in r.getMessage()]
    assert "lets 4 of 10 row(s)" in budget, budget
    cost = re.search(r"at most \$([0-9.e-]+) at the batch price", budget)
    assert cost and float(cost.group(1)) > 0, budget


@pytest.mark.concurrency
def test_the_batch_record_is_named_with_its_s3_uri(prefect_harness, judge_env, s3_output, tmp_path) -> None:  # noqa: F811
    data = write_parquet(tmp_path / "eval.parquet", make_rows(4, seed=59))
    params = RunParams(dataset_uri=data, output_uri=s3_output, judge="openai", base_url=judge_env.base_url,
                       batch=True)  # fmt: skip
    judge_env.batch_hold = True
    summary = recall_benchmark(params)
    assert summary["status"] == "batch_pending"
    assert summary["record"].startswith(f"{s3_output}/_batches/") and summary["record"].endswith(".json"), summary
