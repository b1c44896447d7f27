"""Hints printed by the CLI name its flags (``--on-missing skip``), not Python parameters (``on_missing=...``)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from recall_tasks.cli import app as cli
from recall_tasks.errors import MissingInputError
from tests.test_pipeline import make_rows, write_parquet


def test_missing_input_hint_names_cli_flags_in_a_run(prefect_harness, tmp_path: Path) -> None:
    rows = make_rows(4, seed=3)
    rows[1]["ground_truth"] = ""
    data = write_parquet(tmp_path / "eval.parquet", rows)
    result = CliRunner().invoke(cli.app, ["run", data, "-o", str(tmp_path / "out")], env={"COLUMNS": "400"})
    assert result.exit_code != 0
    assert "required field 'expected_output' is missing or empty" in result.output, result.output
    assert "--on-missing skip" in result.output and "--on-missing zero" in result.output, result.output
    assert "on_missing=" not in result.output


def test_missing_input_hint_names_python_parameters_in_the_library() -> None:
    assert "on_missing='skip'" in str(MissingInputError("expected_output", "Contextual Recall"))


def test_a_label_of_the_same_dataset_name_elsewhere_points_to_dataset_name(prefect_harness, tmp_path: Path) -> None:
    """Dated folders of one dataset are two series: `--baseline label:a` found nothing and said "labels available:
    none" beside a run labelled 'a' of a dataset shown by the same name; the message names the other location and
    `--dataset-name`."""
    rows = make_rows(12, seed=4)
    first = write_parquet(tmp_path / "evals" / "2026-11-30" / "golden.parquet", rows)
    second = write_parquet(tmp_path / "evals" / "2026-12-01" / "golden.parquet", rows)
    out = str(tmp_path / "out")
    done = CliRunner().invoke(cli.app, ["run", second, "-o", out, "--label", "a"])
    assert done.exit_code == 0, done.output
    refused = CliRunner().invoke(cli.app, ["run", first, "-o", out, "--baseline", "label:a"], env={"COLUMNS": "400"})
    assert refused.exit_code == 2, refused.output
    said = refused.output
    assert "no completed run labelled 'a' for dataset 'golden'" in said, said
    assert "2026-12-01/golden.parquet" in said and "--dataset-name" in said, said
