"""``run --canary LABELS`` through the real flow and CLI: a small labelled set judged with every run, its agreement
recorded in ``runs``, and judge drift caught before it reads as a regression (issue 34, item 2).

The judge is the fake OpenAI server answering from labels (tests/judge_labels.py) with a known flip rate: the
canary's units and the dataset's units (labelled with judge_script's truth) alike, so a drifted judge moves the
dataset's scores as a real one would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from prefect.events.clients import AssertingEventsClient
from prefect.testing.fixtures import asserting_events_worker  # noqa: F401 - pytest fixture
from typer.testing import CliRunner

from recall_tasks import split_sentences
from recall_tasks.analysis.agreement import agreement
from recall_tasks.analysis.regression import compare_runs
from recall_tasks.cli.app import app
from recall_tasks.config import RunParams
from recall_tasks.errors import BudgetExhausted
from recall_tasks.io.labels import load_labels
from recall_tasks.io.schemas import CANARY_FIELDS
from recall_tasks.pipeline.flow import recall_benchmark
from tests import judge_script
from tests.judge_labels import LabelJudge
from tests.test_pipeline import KEY, make_rows
from tests.test_tracking import degrade

CANARY_ROWS = 30


def labelled(rows: list[dict]) -> list[dict]:
    """The rows with their human labels: judge_script's truth for each sentence of the reference."""
    out = []
    for r in rows:
        truth = judge_script.truth("contextual_recall", split_sentences(r["ground_truth"]), r["contexts"])
        out.append({**r, "labels": [v == "yes" for v, _ in truth]})
    return out


def supported(rows: list[dict]) -> list[dict]:
    """The rows with a chunk supporting each sentence of the reference (recall 1.0 under an accurate judge)."""
    return [
        {**r, "contexts": [s.rstrip(".").lower() + " with context" for s in split_sentences(r["ground_truth"])]}
        for r in rows
    ]


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def write_parquet(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def posts(fake: Any) -> list[dict]:
    """The judge requests the fake server received (not the pre-flight's model listing)."""
    return [r for r in fake.requests if r.get("method", "POST") == "POST"]


class Nights:
    """A dataset, a canary, and a judge whose flip rate each night sets (the same judge for both)."""

    def __init__(self, tmp_path: Path, fake: Any) -> None:
        self.tmp, self.fake = tmp_path, fake
        self.rows = supported(make_rows(60, seed=41))
        self.canary = write_jsonl(tmp_path / "canary.jsonl", labelled(make_rows(CANARY_ROWS, seed=97)))
        self.out = str(tmp_path / "out")

    def judge(self, flip_rate: float, rows: list[dict]) -> LabelJudge:
        """Answer the canary and ``rows`` from their labels, ``flip_rate`` of each one's units the other way."""
        data = LabelJudge(load_labels(write_jsonl(self.tmp / "truth.jsonl", labelled(rows))), flip_rate, fallback=None)
        canary = LabelJudge(load_labels(self.canary), flip_rate, fallback=data)
        self.fake.set_responder(canary)
        return canary

    def data(self, name: str, rows: list[dict]) -> str:
        return write_parquet(self.tmp / name / "eval.parquet", rows)

    def params(self, data: str, label: str, **kw: Any) -> RunParams:
        return RunParams(
            dataset_uri=data, output_uri=self.out, judge="openai", base_url=self.fake.base_url, label=label,
            dataset_name="eval", canary=self.canary, chunk_size=20, **kw,
        )  # fmt: skip

    def runs(self) -> dict[str, dict]:
        table = DeltaTable(f"{self.out}/runs").to_pyarrow_table().to_pylist()
        return {r["label"]: r for r in table if r["segment_column"] is None}

    def comparisons(self) -> list[dict]:
        table = DeltaTable(f"{self.out}/comparisons").to_pyarrow_table().to_pylist()
        return sorted((c for c in table if c["segment_column"] is None), key=lambda c: c["compared_at"])


@pytest.fixture
def nights(fake_openai, monkeypatch, tmp_path) -> Nights:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    return Nights(tmp_path, fake_openai)


def test_a_judge_that_drifts_behind_the_same_name_is_judge_drift_not_a_regression(
    prefect_harness,
    asserting_events_worker,  # noqa: F811
    nights: Nights,
) -> None:
    data = nights.data("v1", nights.rows)
    nights.judge(0.0, nights.rows)
    first = recall_benchmark(nights.params(data, "n1"))
    canary_units = first["canary_units"]
    assert first["canary_rows"] == CANARY_ROWS and canary_units > CANARY_ROWS
    assert first["canary_accuracy"] == 1.0 and first["canary_kappa"] == 1.0  # the judge agrees on every unit
    assert (first["canary_accuracy_low"], first["canary_accuracy_high"]) == (1.0, 1.0)
    assert first["canary_requests"] == CANARY_ROWS and first["requests"] == len(nights.rows) + CANARY_ROWS
    assert len(posts(nights.fake)) == first["requests"]  # every judge request counted, the canary's included
    # the next night the provider's model answers 20 % of the units the other way; nothing else changed, but
    # the verdicts are judged afresh (the cache refreshed: an expiry, --refresh-cache, or new rows)
    drifted = nights.judge(0.2, nights.rows)
    second = recall_benchmark(nights.params(data, "n2", refresh_cache=True))
    expected = agreement(drifted.expected_rows())  # the figures a 20 % flip rate implies, exactly
    assert second["canary_accuracy"] == pytest.approx(1 - (canary_units // 5) / canary_units)
    assert second["canary_accuracy"] == pytest.approx(expected.accuracy.value)
    assert second["canary_kappa"] == pytest.approx(expected.kappa.value)
    assert second["canary_accuracy_high"] < 1.0 and second["canary_cached"] == 0
    comparison = second["comparison"]
    assert comparison["verdict"] == "incomparable" and comparison["judge_drift"] is True
    assert comparison["reason"].startswith("judge drift: canary accuracy 1.000 -> ")
    assert comparison["canary"]["baseline"]["accuracy"][0] == 1.0
    assert comparison["canary"]["current"]["accuracy"][0] == second["canary_accuracy"]
    recorded = nights.comparisons()[-1]
    assert recorded["verdict"] == "incomparable" and recorded["judge_drift"] is True
    history = CliRunner().invoke(app, ["history", "--output", nights.out], env={"COLUMNS": "400"})
    assert history.exit_code == 0 and f"incomparable vs {first['run_id']}: judge drift: canary" in history.output
    # without the canary the same two nights read as a regression: the drift is what the canary caught
    runs = nights.runs()
    results = DeltaTable(f"{nights.out}/results").to_pyarrow_table(columns=["run_id", "row_id", "score", "success"])

    def of(run_id: str) -> pa.Table:
        return results.filter(pa.compute.equal(results.column("run_id"), run_id))

    blind = {f.name: None for f in CANARY_FIELDS}
    plain = compare_runs(
        of(second["run_id"]), of(first["run_id"]), current_run={**runs["n2"], **blind},
        baseline_run={**runs["n1"], **blind},
    )  # fmt: skip
    assert plain.verdict == "regressed", (plain.mean_delta, plain.ci_high)
    # the alert says so, with the figures
    asserting_events_worker.drain()
    events = [e for c in AssertingEventsClient.all for e in c.events]
    alert = next(e for e in events if e.event == "recall.comparison.incomparable")
    assert alert.payload["judge_drift"] is True and "(judge drift)" in alert.payload["subject"]
    assert "Judge drift: the judge's agreement with the canary's labels" in alert.payload["message"]
    assert not [e for e in events if e.event == "recall.regression.detected"]
    completed = [e.payload for e in events if e.event == "recall.run.completed"]
    assert [p["canary_accuracy"] for p in completed] == [1.0, second["canary_accuracy"]]


def test_a_retrieval_that_changes_under_the_same_judge_is_regressed_and_the_canary_is_cached(
    prefect_harness, nights: Nights, tmp_path: Path
) -> None:
    runner = CliRunner()
    base = ["--output", nights.out, "--judge", "openai", "--base-url", nights.fake.base_url, "--dataset-name", "eval",
            "--canary", nights.canary, "--chunk-size", "20"]  # fmt: skip
    data = nights.data("v1", nights.rows)
    nights.judge(0.0, nights.rows)
    first = runner.invoke(app, ["run", data, "--label", "n1", *base], env={"COLUMNS": "200"})
    assert first.exit_code == 0, first.output
    shown = f"accuracy 1.000 (95 % CI 1.000..1.000), kappa 1.000 (1.000..1.000) over {CANARY_ROWS} rows"
    assert shown in first.output, first.output
    # a rerun of unchanged data with an unchanged judge judges nothing, the canary included
    before = len(posts(nights.fake))
    again = runner.invoke(app, ["run", data, "--label", "n1-again", *base])
    assert again.exit_code == 0, again.output
    assert len(posts(nights.fake)) == before
    cached = nights.runs()["n1-again"]
    assert cached["canary_requests"] == 0 and cached["canary_cached"] == CANARY_ROWS and cached["requests"] == 0
    assert cached["canary_accuracy"] == 1.0
    # the next night the index loses the supporting chunks of every 5th row; the judge is the same
    worse_rows = degrade(nights.rows, 5)
    worse = nights.data("v2", worse_rows)
    nights.judge(0.0, worse_rows)
    second = runner.invoke(app, ["run", worse, "--label", "n2", "--fail-on-regression", *base])
    assert second.exit_code == 3, second.output
    assert "regressed" in second.output and "judge drift" not in second.output
    runs = nights.runs()
    assert runs["n2"]["canary_requests"] == CANARY_ROWS  # re-judged: tonight's judge answered fresh rows
    assert runs["n2"]["canary_accuracy"] == 1.0 and runs["n2"]["canary_id"] == runs["n1"]["canary_id"]
    recorded = nights.comparisons()[-1]
    assert recorded["verdict"] == "regressed" and recorded["judge_drift"] is False
    history = runner.invoke(app, ["history", "--output", nights.out], env={"COLUMNS": "250"})
    assert history.exit_code == 0 and "regressed vs" in history.output


@pytest.mark.parametrize(
    ("canary", "extra", "message"),
    [
        ("missing.jsonl", [], "error: --canary: labelled set not found: {tmp}/missing.jsonl"),
        ("bad.jsonl", [], "error: --canary: "),
        ("canary.jsonl", ["--units", "claims"], "error: --canary needs --units sentences"),
        ("scores.jsonl", [], "no row has unit labels"),
    ],
)
def test_a_bad_canary_is_refused_before_any_judge_call_or_write(
    nights: Nights, tmp_path: Path, canary: str, extra: list[str], message: str
) -> None:
    rows = labelled(make_rows(3, seed=5))
    write_jsonl(tmp_path / "bad.jsonl", [{**rows[0], "labels": [True] * 9}])  # more labels than sentences
    write_jsonl(tmp_path / "scores.jsonl", [{**{k: v for k, v in r.items() if k != "labels"}, "expected_score": 1.0}
                                            for r in rows])  # fmt: skip
    data = nights.data("v1", nights.rows)
    out = tmp_path / "refused"
    result = CliRunner().invoke(
        app,
        ["run", data, "--output", str(out), "--judge", "openai", "--base-url", nights.fake.base_url,
         "--canary", str(tmp_path / canary), *extra],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and message.format(tmp=tmp_path) in lines[0], result.output
    if canary == "bad.jsonl":
        assert "row 0" in lines[0] and "labels" in lines[0]
    assert nights.fake.requests == [] and not out.exists()


def test_an_output_written_before_the_canary_columns_takes_a_canary_run(prefect_harness, tmp_path: Path) -> None:
    from deltalake import write_deltalake

    runner = CliRunner()
    data = write_parquet(tmp_path / "v1" / "eval.parquet", supported(make_rows(12, seed=3)))  # 10 for a verdict
    canary = write_jsonl(tmp_path / "canary.jsonl", labelled(make_rows(6, seed=9)))
    out = str(tmp_path / "out")
    for label in ("old", "older"):
        assert runner.invoke(app, ["run", data, "--output", out, "--label", label]).exit_code == 0
    for table, dropped in (("runs", [f.name for f in CANARY_FIELDS]), ("comparisons", ["judge_drift"])):
        old = DeltaTable(f"{out}/{table}").to_pyarrow_table().drop_columns(dropped)  # as written before them
        write_deltalake(f"{out}/{table}", old, mode="overwrite", schema_mode="overwrite")
    new = runner.invoke(app, ["run", data, "--output", out, "--label", "new", "--canary", canary])
    assert new.exit_code == 0, new.output
    assert ": unchanged (" in new.output and "the baseline run has no canary: judge drift not checked" in new.output
    sql = "SELECT label, canary_rows, canary_accuracy FROM runs WHERE segment_column IS NULL ORDER BY label"
    queried = runner.invoke(app, ["query", sql, "-o", out, "--output-format", "json"])
    assert queried.exit_code == 0, queried.output
    got = [json.loads(line) for line in queried.output.splitlines() if line.strip()]
    assert got == [
        {"label": "new", "canary_rows": 6, "canary_accuracy": 1.0},
        {"label": "old", "canary_rows": None, "canary_accuracy": None},
        {"label": "older", "canary_rows": None, "canary_accuracy": None},
    ]
    drift = DeltaTable(f"{out}/comparisons").to_pyarrow_table().column("judge_drift").to_pylist()
    assert sorted(drift, key=lambda v: v is None) == [False, None]


def test_a_dry_run_names_the_canary_and_refuses_a_bad_one(nights: Nights, tmp_path: Path) -> None:
    data = nights.data("v1", nights.rows)
    base = ["run", data, "--output", str(tmp_path / "dry"), "--judge", "openai", "--base-url", nights.fake.base_url,
            "--dry-run"]  # fmt: skip
    dry = CliRunner().invoke(app, [*base, "--canary", nights.canary], env={"COLUMNS": "300"})
    assert dry.exit_code == 0, dry.output
    assert f"canary: {CANARY_ROWS} labelled rows judged at the end of the run, re-judged" in dry.output, dry.output
    bad = CliRunner().invoke(app, [*base, "--canary", str(tmp_path / "nope.jsonl")])
    assert bad.exit_code == 2 and "error: --canary: labelled set not found" in bad.output, bad.output
    assert nights.fake.requests == [] and not (tmp_path / "dry").exists()


@pytest.mark.concurrency
def test_the_canary_draws_on_the_whole_runs_budget_with_worker_processes(prefect_harness, nights: Nights) -> None:
    """--max-requests holds for the run, canary included, when the chunks were judged in worker processes."""
    rows = nights.rows[:30]
    data = nights.data("v1", rows)
    nights.judge(0.0, rows)
    with pytest.raises(BudgetExhausted) as stopped:  # the canary's last 25 rows were kept from the judge
        recall_benchmark(nights.params(data, "procs", max_requests=len(rows) + 5, task_runner="processes", workers=1))
    summary = stopped.value.summary
    assert summary["status"] == "budget_exhausted"
    assert len(posts(nights.fake)) == len(rows) + 5  # one budget: the workers' 30 and the canary's 5
    assert summary["scored"] == len(rows) and summary["canary_requests"] == 5
    assert summary["canary_rows"] == 5 and summary["canary_errors"] == CANARY_ROWS - 5
    assert summary["requests"] == len(rows) + 5
