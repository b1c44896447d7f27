"""``--batch`` output: progress at INFO (not WARNING), and the budget line's cost is the batch's real bound."""

from __future__ import annotations

import logging
import re

import pytest

from recall_tasks.config import RunParams
from recall_tasks.pipeline.flow import recall_benchmark
from tests.test_batch import judge_env  # noqa: F401 - a fixture
from tests.test_pipeline import make_rows, write_parquet


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
