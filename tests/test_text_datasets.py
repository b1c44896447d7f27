"""Datasets as JSON lines and CSV: read by pyarrow.json / pyarrow.csv, through the same checks as Parquet.

The rows, their ids and content hashes are the same as the Parquet file's; the errors are the same one-line
``DatasetError``s naming the file, row and column.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from deltalake import DeltaTable
from typer.testing import CliRunner

from recall_tasks.cli import app as cli
from recall_tasks.errors import DatasetError
from recall_tasks.io.blocks import iter_blocks
from recall_tasks.io.datasets import open_dataset
from recall_tasks.io.storage import StorageConfig
from tests.test_pipeline import make_rows, write_parquet


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _csv(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        for r in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()})
    return str(path)


def _rows(uri: str) -> list[tuple[str, str, list]]:
    ds = open_dataset(uri, StorageConfig())
    out = []
    for block in iter_blocks(ds, 4):
        ctxs = block.table.column("retrieval_context").to_pylist()
        out += list(zip(block.row_ids, block.content_hashes, ctxs, strict=True))
    return out


@pytest.mark.parametrize("name", ["eval.jsonl", "eval.ndjson", "eval_no_extension", "eval.csv"])
def test_text_formats_read_like_parquet(tmp_path: Path, name: str) -> None:
    rows = make_rows(10, seed=3)
    parquet = write_parquet(tmp_path / "eval.parquet", rows)
    text = (_csv if name.endswith(".csv") else _jsonl)(tmp_path / "t" / name, rows)
    assert _rows(text) == _rows(parquet)
    ds = open_dataset(text, StorageConfig())
    assert ds.num_rows == 10 and "category" in ds.passthrough


def _error(uri: str) -> str:
    with pytest.raises(DatasetError) as info:
        open_dataset(uri, StorageConfig())
    message = str(info.value)
    assert "\n" not in message
    return message


def test_text_format_errors_name_file_row_and_column(tmp_path: Path) -> None:
    rows = make_rows(4, seed=3)
    bad_ctx = [dict(r, contexts="one string") for r in rows]  # a string, not a list
    path = _jsonl(tmp_path / "ctx.jsonl", bad_ctx)
    assert "expected list<string>" in _error(path) and path in _error(path) and "'contexts'" in _error(path)

    mixed = [*rows[:2], dict(rows[2], contexts="x"), rows[3]]  # one row of another type
    path = _jsonl(tmp_path / "mixed.jsonl", mixed)
    message = _error(path)
    assert path in message and "row 2" in message and "contexts" in message, message

    path = _jsonl(tmp_path / "broken.jsonl", rows)
    Path(path).write_text(Path(path).read_text() + '{"question": "x", \n')
    message = _error(path)
    assert path in message and "JSON" in message, message

    path = _csv(tmp_path / "bad.csv", rows)
    lines = Path(path).read_text().splitlines()
    lines[3] = lines[3].replace('"[', '"not json [', 1)  # row 2's context list
    Path(path).write_text("\n".join(lines) + "\n")
    message = _error(path)
    assert path in message and "row 2" in message and "'contexts'" in message and "JSON" in message, message

    dup = [rows[0], dict(rows[1], row_id=rows[0]["row_id"])]
    message = _error(_jsonl(tmp_path / "dup.jsonl", dup))
    assert "row_id must be unique" in message and "rows 0" in message


def test_a_csv_line_that_does_not_parse_is_named_not_quoted(tmp_path: Path) -> None:
    """A CSV line with the wrong number of fields: its line number and counts, never its text (issue 58)."""
    shadow = "root:$6$saltsalt$hashhashhash:19000:0:99999:7:::"
    path = _csv(tmp_path / "bad.csv", make_rows(3, seed=3))
    lines = Path(path).read_text().splitlines()
    Path(path).write_text("\n".join([*lines[:2], shadow, *lines[2:]]) + "\n")
    message = _error(path)
    assert path in message and "line 3" in message and f"1 field, expected {lines[0].count(',') + 1}" in message
    assert "saltsalt" not in message and "hashhash" not in message, message


def test_unknown_format_names_the_expected_ones(tmp_path: Path) -> None:
    path = tmp_path / "data.txt"
    path.write_text("just some words\n")
    message = _error(str(path))
    assert "Parquet magic bytes" not in message
    assert "Parquet" in message and ".jsonl" in message and ".csv" in message, message


def test_cli_run_and_dry_run_read_jsonl(prefect_harness, tmp_path: Path) -> None:
    rows = make_rows(8, seed=4)
    data = _jsonl(tmp_path / "data.jsonl", rows)
    out = tmp_path / "out"
    dry = CliRunner().invoke(cli.app, ["run", data, "-o", str(out), "--dry-run"], env={"COLUMNS": "400"})
    assert dry.exit_code == 0, dry.output
    assert "8 rows" in dry.output and not out.exists()
    result = CliRunner().invoke(cli.app, ["run", data, "-o", str(out)], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    (run,) = DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist()
    assert run["rows"] == 8
