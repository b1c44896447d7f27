"""Regression tracking through the real flow: baselines, comparisons table, events, artifacts, failing runs."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from prefect.events.clients import AssertingEventsClient
from prefect.events.worker import EventsWorker
from prefect.testing.fixtures import asserting_events_worker  # noqa: F401 - pytest fixture

from recall_tasks import split_sentences
from recall_tasks.config import RunParams
from recall_tasks.errors import RegressionDetected
from recall_tasks.pipeline.artifacts import artifact_key
from recall_tasks.pipeline.flow import recall_benchmark
from tests.test_pipeline import make_rows


def write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def events(worker: EventsWorker) -> list:
    worker.drain()
    return [e for client in AssertingEventsClient.all for e in client.events]


def degrade(rows: list[dict], every: int) -> list[dict]:
    """Drop the supporting chunks of every ``every``-th row: its recall falls to 0."""
    out = []
    for i, r in enumerate(rows):
        r = dict(r)
        if i % every == 0:
            r["contexts"] = ["unrelated filler text"]
        out.append(r)
    return out


def test_series_baseline_comparison_events_and_fail(prefect_harness, asserting_events_worker, tmp_path):  # noqa: F811
    rows = [r for r in make_rows(200, seed=31) if any(c != "unrelated filler text" for c in r["contexts"])]
    out = str(tmp_path / "out")
    data = write(tmp_path / "v1" / "eval.parquet", rows)
    first = recall_benchmark(
        RunParams(dataset_uri=data, output_uri=out, label="prod", segment_by=["category"], dataset_name="eval")
    )
    assert "comparison" not in first
    same = recall_benchmark(
        RunParams(dataset_uri=data, output_uri=out, label="idx-2", segment_by=["category"], dataset_name="eval")
    )
    assert same["comparison"]["verdict"] == "unchanged" and same["comparison"]["mean_delta"] == 0
    worse = write(tmp_path / "v2" / "eval.parquet", degrade(rows, 5))
    with pytest.raises(RegressionDetected, match="regressed against"):
        recall_benchmark(
            RunParams(
                dataset_uri=worse,
                output_uri=out,
                label="idx-3",
                baseline="label:prod",
                segment_by=["category"],
                fail_on_regression=True,
                dataset_name="eval",
            )
        )
    comparisons = DeltaTable(f"{out}/comparisons").to_pyarrow_table().to_pylist()
    overall = sorted((c for c in comparisons if c["segment_column"] is None), key=lambda c: c["compared_at"])
    assert [c["verdict"] for c in overall] == ["unchanged", "regressed"]
    regressed = overall[1]
    assert regressed["baseline_run_id"] == first["run_id"]
    degraded = len(range(0, len(rows), 5))
    assert regressed["flips_pass_to_fail"] >= degraded * 0.8 and regressed["mean_delta"] < -0.1
    assert regressed["ci_high"] < 0
    assert {c["segment_value"] for c in comparisons if c["segment_column"] == "category"} == {"a", "b", "c"}
    runs = DeltaTable(f"{out}/runs").to_pyarrow_table().to_pylist()
    assert len([r for r in runs if r["segment_column"] is None]) == 3  # the failing run is still committed
    # this test's runs only: an earlier test's flow on this worker may still have events in the queue
    ours = {r["run_id"] for r in runs}
    mine = [
        e for e in events(asserting_events_worker) if e.resource.get("recall.run_id", e.payload.get("run_id")) in ours
    ]
    names = [e.event for e in mine]
    assert names.count("recall.run.completed") == 3 and names.count("recall.regression.detected") == 1
    detected = next(e for e in mine if e.event == "recall.regression.detected")
    assert detected.resource.id == "recall.dataset.eval" and detected.payload["verdict"] == "regressed"
    # the report names the statements the worst rows lost (verdicts are read for those rows only)
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[artifact_key("regression", "eval", "contextual_recall")])
            )
        )
    report = max(artifacts, key=lambda a: a.created).data
    lost = [line.split("lost: ", 1)[1] for line in report.splitlines() if line.strip().startswith("- lost: ")]
    degraded_sentences = {s for i, r in enumerate(rows) if i % 5 == 0 for s in split_sentences(r["ground_truth"])}
    assert lost and set(lost) <= degraded_sentences


def test_unknown_baseline_label_is_a_clear_error(prefect_harness, tmp_path):
    out = str(tmp_path / "out")
    data = write(tmp_path / "eval.parquet", make_rows(10))
    recall_benchmark(RunParams(dataset_uri=data, output_uri=out, label="a"))
    with pytest.raises(Exception, match="label"):
        recall_benchmark(RunParams(dataset_uri=data, output_uri=out, baseline="label:nope", refresh_cache=True))


def test_no_baseline_skips_comparison(prefect_harness, tmp_path):
    out = str(tmp_path / "out")
    data = write(tmp_path / "eval.parquet", make_rows(10))
    recall_benchmark(RunParams(dataset_uri=data, output_uri=out))
    second = recall_benchmark(RunParams(dataset_uri=data, output_uri=out, baseline=None))
    assert "comparison" not in second


def test_cli_history_and_comparisons_query(prefect_harness, tmp_path):
    from typer.testing import CliRunner

    from recall_tasks.cli.app import app

    out = str(tmp_path / "out")
    rows = make_rows(40, seed=3)
    base = write(tmp_path / "v1" / "eval.parquet", rows)
    worse = write(tmp_path / "v2" / "eval.parquet", degrade(rows, 2))
    runner = CliRunner()
    series = ["--dataset-name", "eval"]  # the two index versions' files are one series
    assert runner.invoke(app, ["run", base, "--output", out, "--label", "prod", *series]).exit_code == 0
    failed = runner.invoke(app, ["run", worse, "--output", out, "--label", "v2", "--fail-on-regression", *series])
    assert failed.exit_code == 3 and "regression" in failed.output
    history = runner.invoke(app, ["history", "--output", out], env={"COLUMNS": "200"})
    assert history.exit_code == 0 and "first of series" in history.output and "regressed vs" in history.output
    query = runner.invoke(
        app, ["query", "SELECT verdict FROM comparisons WHERE segment_column IS NULL", "--output", out]
    )
    assert query.exit_code == 0 and "regressed" in query.output


def test_two_index_versions_as_two_files_point_at_dataset_name_and_require_baseline_gates(prefect_harness, tmp_path):
    """golden_v1.parquet then golden_v2.parquet into one output: two series. The first run of the second says the
    other exists and names the flag that joins it; that flag makes the gate fire; --require-baseline exits 7."""
    from typer.testing import CliRunner

    from recall_tasks.cli.app import app
    from tests.test_outcomes import flow_run_state
    from tests.test_verdicts import runs_of

    out = str(tmp_path / "out")
    rows = make_rows(40, seed=3)
    v1 = write(tmp_path / "golden_v1.parquet", rows)
    v2 = write(tmp_path / "golden_v2.parquet", degrade(rows, 2))
    runner = CliRunner()
    assert runner.invoke(app, ["run", v1, "--output", out]).exit_code == 0
    second = runner.invoke(app, ["run", v2, "--output", out, "--fail-on-regression"], env={"COLUMNS": "300"})
    assert second.exit_code == 0, second.output
    assert (
        "first run of its series: no baseline to compare with; this output holds another series of "
        "contextual_recall: golden_v1 (--dataset-name golden_v1 compares this run with it)" in second.output
    ), second.output
    joined = runner.invoke(app, ["run", v2, "--output", out, "--fail-on-regression", "--dataset-name", "golden_v1"])
    assert joined.exit_code == 3 and "regressed" in joined.output, joined.output
    # a nightly gate that must compare: a run with no baseline is its own exit code, the flow run Failed
    v3 = write(tmp_path / "golden_v3.parquet", rows)
    gated = runner.invoke(app, ["run", v3, "--output", out, "--fail-on-regression", "--require-baseline"],
                          env={"COLUMNS": "300"})  # fmt: skip
    assert gated.exit_code == 7, gated.output
    assert "no baseline: run " in gated.output and "(--require-baseline): first run of its series" in gated.output
    assert "regression:" not in gated.output
    (run,) = [r for r in runs_of(out) if r["dataset"] == "golden_v3"]
    assert run["status"] == "completed" and flow_run_state(run["flow_run_id"]).is_failed()
    # with a baseline it passes: the same file again
    again = runner.invoke(app, ["run", v3, "--output", out, "--require-baseline", "--label", "again"])
    assert again.exit_code == 0 and "vs baseline" in again.output, again.output
