"""What a run with document ids prints and returns (issue 59, items 8 and 9): the summary shows recall, nDCG and MRR
at every k, a ``retrieval_ids`` run's pass rate is named hit_rate@k (no threshold), and ``evaluate().to_pandas()``
has one column per id metric."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recall_tasks.cli.app import app
from tests.test_id_pipeline import id_rows, recall_at, write

pytestmark = pytest.mark.concurrency


def _cells(output: str) -> dict[str, str]:
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^│ (\S+)\s+│ (.*?)\s*│$", output, re.M)}


def test_a_retrieval_ids_run_prints_its_id_metrics_and_names_its_pass_rate_hit_rate(prefect_harness, tmp_path: Path):
    rows = id_rows(30, lose=0.4)
    data, out = write(tmp_path / "data" / "eval.parquet", rows), str(tmp_path / "out")
    done = CliRunner().invoke(
        app, ["run", data, "-o", out, "--metric", "retrieval_ids", "--id-pattern", "^(.+)::"], env={"COLUMNS": "200"}
    )
    assert done.exit_code == 0, done.output
    cells = _cells(done.output)
    assert "pass_rate" not in cells and "threshold" not in cells, done.output
    hits = sum(any(str(d).split("::")[0] in set(r["reference_context_ids"]) for d in r["retrieved_context_ids"])
               for r in rows) / len(rows)  # fmt: skip
    assert cells["hit_rate@10"] == f"{hits:.4g}"
    assert cells["recall@1/5/10"] == " / ".join(f"{recall_at(rows, k):.4g}" for k in (1, 5, 10)), done.output
    assert re.fullmatch(r"[0-9.]+ / [0-9.]+ / [0-9.]+", cells["ndcg@1/5/10"]), done.output
    assert re.fullmatch(r"[0-9.]+ / [0-9.]+ / [0-9.]+", cells["mrr@1/5/10"]), done.output
    fields = list(cells)
    assert fields.index("hit_rate@10") + 1 == fields.index("recall@1/5/10"), fields


def test_evaluate_to_pandas_gives_one_float_column_per_id_metric() -> None:
    import pandas as pd

    from recall_tasks import evaluate

    rows = id_rows(12, ints=True, lose=0.5)
    rows[3]["reference_context_ids"] = []  # not assessed: NaN, not a missing column
    frame = evaluate(rows, metric="retrieval_ids", on_missing="skip").to_pandas()
    assert "id_metrics" not in frame.columns
    names = [f"{m}@{k}" for k in (1, 5, 10) for m in ("recall", "precision", "hit_rate", "mrr", "ndcg")]
    assert set(names) <= set(frame.columns), list(frame.columns)
    assert all(frame[name].dtype == "float64" for name in names)
    assessed = [r for i, r in enumerate(rows) if i != 3]
    assert frame["recall@5"].drop(index=3).mean() == pytest.approx(recall_at(assessed, 5))
    assert pd.isna(frame.loc[3, "recall@10"]) and frame.loc[3, "skipped"]
