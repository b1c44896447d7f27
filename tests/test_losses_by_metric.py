"""A regressed run whose data has document ids: "Segments that lost most" keeps the judged score and the id metrics
apart, each row naming its metric (issue 59, item 7: ``billing regressed -0.2667`` printed three times, no metric)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recall_tasks.cli.app import app
from tests.test_id_pipeline import id_rows, write

pytestmark = pytest.mark.concurrency


def _rows(lost: bool) -> list[dict]:
    rows = id_rows(40, lose=1.0 if lost else 0.0, ints=True)
    for i, row in enumerate(rows):
        row["category"] = "billing" if i % 2 == 0 else "search"
        if lost and i % 2 == 0:  # billing lost its documents: the contexts the judge reads and their ids
            row["contexts"] = ["unrelated filler text"]
        elif lost:
            row["retrieved_context_ids"] = id_rows(40, ints=True)[i]["retrieved_context_ids"]
    return rows


def test_segments_that_lost_most_name_their_metric_and_keep_the_id_metrics_apart(prefect_harness, tmp_path: Path):
    data, out = tmp_path / "data" / "eval.parquet", str(tmp_path / "out")
    common = [str(data), "-o", out, "--judge", "lexical", "--segment-by", "category"]
    write(data, _rows(lost=False))
    assert CliRunner().invoke(app, ["run", *common, "--label", "v1"]).exit_code == 0
    write(data, _rows(lost=True))
    second = CliRunner().invoke(app, ["run", *common, "--label", "v2"], env={"COLUMNS": "250"})
    assert second.exit_code == 0 and ": regressed (" in second.output, second.output
    judged, ids = (
        second.output.split("Segments that lost most:", 1)[1]
        .split("Rows that lost most", 1)[0]
        .split("Segments that lost most by the id metrics (reported, not the verdict):")
    )
    assert re.search(r"┃ metric\s+┃ segment_column\s+┃ segment_value\s+┃ verdict\s+┃ mean_delta", judged), judged
    (billing,) = re.findall(r"^│ (\S+)\s+│ category\s+│ billing\s+│ regressed\s+│", judged, re.M)
    assert billing == "contextual_recall" and " search " not in judged, judged
    by_metric = re.findall(r"^│ (\S+)\s+│ category\s+│ billing\s+│", ids, re.M)
    assert len(by_metric) == 3 and "contextual_recall" not in by_metric and len(set(by_metric)) == 3, ids
    assert all(re.fullmatch(r"(recall|precision|hit_rate|mrr|ndcg)@\d+", m) for m in by_metric), ids
    assert " search " not in ids, ids
    queries = re.findall(r'recall-bench query "([^"]+)"', second.output)
    assert all("metric = 'contextual_recall'" in q or "metric <> 'contextual_recall'" in q
               for q in queries if "FROM comparisons" in q), queries  # fmt: skip
