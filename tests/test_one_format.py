"""One output holds one format (issue 31 item 2): a run, a dry run, ``maintain`` and the readers asking for
another format than the one at ``--output`` are refused with one ``error:`` line naming the output, the format
found and the format asked, exit 2, before any judge call or write. An output an older recall-bench let two
formats write to is refused by ``run`` and ``maintain`` (maintenance of one would delete the other's files as
orphans); a reader may still pick one with ``--format``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from recall_tasks.cli.app import app
from recall_tasks.io.results import ResultStore
from recall_tasks.io.storage import StorageConfig, filesystem
from tests.test_maintain import night
from tests.test_pipeline import KEY, make_rows

CATALOG = "rbformat"


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def listing(out: str) -> list[str]:
    fs, root = filesystem(out, StorageConfig.from_options())
    return sorted(fs.find(root)) if fs.exists(root) else []


@pytest.fixture
def dataset(tmp_path, fake_openai, monkeypatch) -> list[str]:
    """A dataset and the options of a run judged by the fake OpenAI server."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    path = tmp_path / "data" / "eval.parquet"
    path.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(make_rows(6)), path)
    return [str(path), "--judge", "openai", "--base-url", fake_openai.base_url]


def refused(result: Any, out: str, found: str, asked: str) -> None:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and all(line.startswith(("error:", "judge:")) for line in lines), result.output
    assert f"--output {out} holds {found} tables, --format {asked} asked" in errors[0]


@pytest.mark.parametrize(
    ("first", "then"),
    [("delta", "iceberg"), ("iceberg", "delta"), ("parquet", "delta"), ("delta", "parquet"), ("iceberg", "parquet")],
)
def test_a_run_of_another_format_is_refused_before_any_judge_call_or_write(tmp_path, dataset, fake_openai, first, then):
    out = str(tmp_path / "out")
    night(ResultStore(out, StorageConfig.from_options(), first), 0)  # type: ignore[arg-type]
    before = listing(out)
    for extra in ([], ["--dry-run"]):
        got = cli("run", *dataset, "-o", out, "--format", then, *extra)
        refused(got, out, first, then)
    assert fake_openai.requests == []
    assert listing(out) == before  # no _warehouse.json, no table, no chunk


def test_a_catalog_on_a_delta_output_on_s3_is_refused(dataset, fake_openai, s3_server, monkeypatch):
    """``--catalog`` alone means Iceberg: on an S3 output holding Delta tables, refused like ``--format iceberg``."""
    for k, v in {**s3_server.env(), **s3_server.iceberg_catalog_env(CATALOG)}.items():
        monkeypatch.setenv(k, v)
    out = f"s3://{s3_server.make_bucket()}/out"
    night(ResultStore(out, StorageConfig.from_options(), "delta"), 0)
    before = listing(out)
    refused(cli("run", *dataset, "-o", out, "--catalog", CATALOG), out, "delta", "iceberg")
    refused(cli("maintain", "-o", out, "--format", "iceberg"), out, "delta", "iceberg")
    assert fake_openai.requests == [] and listing(out) == before


def test_the_readers_and_maintain_refuse_another_format(tmp_path):
    out = str(tmp_path / "out")
    night(ResultStore(out, StorageConfig.from_options(), "iceberg"), 0)
    before = listing(out)
    commands = [
        ["maintain"], ["history"], ["query", "SELECT count(*) FROM results"],
        ["report", "run-000", "--to", str(tmp_path / "r.html")],
    ]  # fmt: skip
    for command in commands:
        refused(cli(*command, "-o", out, "--format", "delta"), out, "iceberg", "delta")
    assert listing(out) == before and not (tmp_path / "r.html").exists()
    assert cli("history", "-o", out, "--format", "iceberg").exit_code == 0


def test_an_output_already_holding_two_formats_is_never_maintained(tmp_path):
    """What the old code let happen: Delta nights, then an Iceberg night into the same folder. ``maintain``
    refuses it with or without ``--format`` (its clean-up would delete the other format's files); the readers
    need ``--format`` to pick one."""
    out = str(tmp_path / "out")
    night(ResultStore(out, StorageConfig.from_options(), "delta"), 0)
    night(ResultStore(out, StorageConfig.from_options(), "iceberg"), 1)
    before = listing(out)
    for fmt in ([], ["--format", "delta"], ["--format", "iceberg"]):
        got = cli("maintain", "-o", out, "--keep-days", "0", "--allow-short-retention", *fmt)
        assert got.exit_code == 2 and "holds tables of 2 formats (delta and iceberg)" in got.output, got.output
        assert got.output.startswith("error:") and len(got.output.strip().splitlines()) == 1
    assert listing(out) == before
    plain = cli("history", "-o", out)
    assert plain.exit_code == 2 and "pass --format to read one" in plain.output
    for fmt, run_id in (("delta", "run-000"), ("iceberg", "run-001")):
        rows = cli("history", "-o", out, "--format", fmt, "--output-format", "json").stdout.splitlines()
        assert [json.loads(r)["run_id"] for r in rows] == [run_id]


def test_an_output_of_one_format_is_found_without_format(tmp_path):
    """The detection the refusal rests on: each format alone is found from the folders it writes."""
    from recall_tasks.io.results import formats_at

    for fmt in ("delta", "parquet", "iceberg"):
        out = str(tmp_path / fmt)
        assert formats_at(out, StorageConfig.from_options()) == []
        night(ResultStore(out, StorageConfig.from_options(), fmt), 0)  # type: ignore[arg-type]
        assert formats_at(out, StorageConfig.from_options()) == [fmt]
    assert Path(tmp_path / "iceberg" / "_warehouse.json").exists()


def test_calibrate_refuses_another_format_before_judging(tmp_path):
    """``calibrate`` writes a table too: into an output of another format, refused like a run."""
    from tests.test_calibrate import labelled_rows

    labels = tmp_path / "labels.jsonl"
    labels.write_text("".join(json.dumps(r) + "\n" for r in labelled_rows()), encoding="utf-8")
    out = str(tmp_path / "out")
    night(ResultStore(out, StorageConfig.from_options(), "delta"), 0)
    before = listing(out)
    refused(
        cli("calibrate", str(labels), "--judge", "lexical", "-o", out, "--format", "iceberg"), out, "delta", "iceberg"
    )
    assert listing(out) == before
