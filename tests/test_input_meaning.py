"""What an input means is kept from the file to the run (issue 59, items 1-5): CSV ids and text as written, a JSON
lines row of any length, ``evaluate()``'s list of dicts by the union of its keys, bytes that are not UTF-8 named by
file, line and column, and qrels covering a few rows refused as a ``--retrieval-uri`` file covering them is.

Real files, real ``recall-bench run`` calls (the offline lexical judge, or ``--metric retrieval_ids``: no judge).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from typer.testing import CliRunner

from recall_tasks import ConfigError, evaluate
from recall_tasks.cli import app as cli
from recall_tasks.errors import DatasetError
from recall_tasks.io.blocks import iter_blocks
from recall_tasks.io.datasets import open_dataset
from recall_tasks.io.storage import StorageConfig


def run(*args: str) -> Any:
    return CliRunner().invoke(cli.app, ["run", *args], env={"COLUMNS": "400"})


def results(out: Path) -> dict[str, dict[str, Any]]:
    return {r["row_id"]: r for r in DeltaTable(str(out / "results")).to_pyarrow_table().to_pylist()}


def write_csv(path: Path, rows: list[dict[str, Any]]) -> str:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        for r in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()})
    return str(path)


def row_ids_and_inputs(uri: str, overrides: dict[str, str] | None = None) -> list[tuple[str, str]]:
    ds = open_dataset(uri, StorageConfig(), overrides=overrides)
    out: list[tuple[str, str]] = []
    for block in iter_blocks(ds, 10):
        out += list(zip(block.row_ids, block.table.column("input").to_pylist(), strict=True))
    return out


# -- 1. CSV cells that look like numbers ------------------------------------------------------------------------


ZEROS = ["001", "002", "010"]


def zero_rows(id_column: str = "row_id") -> list[dict[str, Any]]:
    return [
        {id_column: rid, "question": f"00{n}", "ground_truth": "1990", "contexts": [f"doc {rid}"], "team": "7"}
        for n, rid in enumerate(ZEROS)
    ]


@pytest.mark.parametrize("id_column", ["row_id", "case_id"])
def test_csv_ids_and_text_cells_are_read_as_written(tmp_path: Path, id_column: str) -> None:
    """``001`` stays ``001`` (row_id, or the column ``--column row_id=`` names), a question ``000`` stays text; a
    pass-through column is still inferred (``team`` 7 is a number)."""
    overrides = {"row_id": id_column} if id_column != "row_id" else None
    path = write_csv(tmp_path / "eval.csv", zero_rows(id_column))
    assert row_ids_and_inputs(path, overrides) == [("001", "000"), ("002", "001"), ("010", "002")]
    ds = open_dataset(path, StorageConfig(), overrides=overrides)
    assert ds.passthrough_types["team"] == pa.int64()


def test_a_csv_dataset_joins_qrels_and_retrieval_keyed_by_its_real_ids(prefect_harness, tmp_path: Path) -> None:
    data = write_csv(tmp_path / "eval.csv", zero_rows())
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("001 0 d1 1\n002 0 d2 1\n010 0 d3 1\n")
    retrieval = tmp_path / "retrieved.parquet"
    pq.write_table(pa.table({"row_id": ZEROS, "retrieved_context_ids": [["d1", "x"], ["x", "y"], ["d3"]]}), retrieval)
    out = tmp_path / "out"
    result = run(data, "-o", str(out), "--metric", "retrieval_ids", "--qrels", str(qrels),
                 "--retrieval-uri", str(retrieval))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert {rid: r["score"] for rid, r in results(out).items()} == {"001": 1.0, "002": 0.0, "010": 1.0}


# -- 2. a long JSON lines row -----------------------------------------------------------------------------------


def test_a_json_lines_row_of_5_mib_reads(tmp_path: Path) -> None:
    long = "word " * (1 << 20)  # 5 MiB in one row
    rows = [
        {"row_id": "short", "question": "q?", "ground_truth": "A b.", "contexts": ["a b"]},
        {"row_id": "long", "question": "q?", "ground_truth": "A b.", "contexts": ["a b", long]},
        {"row_id": "after", "question": "q?", "ground_truth": "A b.", "contexts": ["a b"]},
    ]
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = open_dataset(str(path), StorageConfig())
    got = {}
    for block in iter_blocks(ds, 10):
        got.update(zip(block.row_ids, block.table.column("retrieval_context").to_pylist(), strict=True))
    assert got == {r["row_id"]: r["contexts"] for r in rows}


# -- 3. evaluate() on a list of dicts ---------------------------------------------------------------------------


def dict_rows() -> list[dict[str, Any]]:
    return [
        {
            "row_id": f"r{i}",
            "input": f"Question {i}?",
            "expected_output": "Paris is in France.",
            "retrieval_context": ["Paris is in France."],
            "team": "ab"[i % 2],
        }  # fmt: skip
        for i in range(4)
    ]


def test_evaluate_takes_the_columns_of_every_dict_not_the_first_only() -> None:
    rows = dict_rows()
    del rows[0]["team"]  # a segment column the first dict lacks
    result = evaluate(rows, segment_by=["team"])
    table = result.results
    assert table.column("row_id").to_pylist() == ["r0", "r1", "r2", "r3"]
    assert dict(zip(table.column("row_id").to_pylist(), table.column("team").to_pylist(), strict=True)) == {
        "r0": None, "r1": "b", "r2": "a", "r3": "b",
    }  # fmt: skip


def test_a_row_id_the_first_dict_lacks_is_not_dropped_for_every_row() -> None:
    rows = dict_rows()
    del rows[0]["row_id"]
    with pytest.raises(DatasetError, match=r"row_id is null.*row 0.*'row_id'"):
        evaluate(rows)


def test_a_column_of_mixed_types_names_the_column_and_the_row() -> None:
    rows = dict_rows()
    for i, row in enumerate(rows):
        row["bucket"] = i
    rows[2]["bucket"] = "many"
    with pytest.raises(ConfigError) as info:
        evaluate(rows)
    message = str(info.value)
    assert "'bucket'" in message and "row 2" in message and "\n" not in message, message


# -- 4. bytes that are not UTF-8 --------------------------------------------------------------------------------


def test_invalid_utf8_in_json_lines_names_file_line_row_and_column(prefect_harness, tmp_path: Path) -> None:
    rows = [{"row_id": f"r{i}", "question": "q?", "ground_truth": "A b.", "contexts": ["a b", "PLACE"]}
            for i in range(4)]  # fmt: skip
    lines = [json.dumps(r).encode() for r in rows]
    lines[2] = lines[2].replace(b"PLACE", b"caf\xff secret")
    path = tmp_path / "eval.jsonl"
    path.write_bytes(b"\n".join([lines[0], b"", *lines[1:]]) + b"\n")  # a blank line: line 4 is row 2
    out = tmp_path / "out"
    result = run(str(path), "-o", str(out))
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert "UnicodeDecodeError" not in message and "secret" not in message, message
    assert str(path) in message and "line 4" in message and "row 2" in message and "'contexts'" in message, message
    assert "UTF-8" in message and not out.exists()


def test_invalid_utf8_in_a_csv_text_column_names_row_and_column(tmp_path: Path) -> None:
    path = Path(write_csv(tmp_path / "eval.csv", zero_rows()))
    path.write_bytes(path.read_bytes().replace(b",001,", b",00\xff1,"))  # row 1's question
    with pytest.raises(DatasetError) as info:
        open_dataset(str(path), StorageConfig())
    message = str(info.value)
    assert str(path) in message and "UTF-8" in message and "row 1" in message and "'question'" in message, message


# -- 5. qrels covering a few rows -------------------------------------------------------------------------------


def test_qrels_covering_1_of_100_rows_are_refused_as_a_retrieval_file_is(prefect_harness, tmp_path: Path) -> None:
    rows = [{"row_id": f"q{i}", "question": "q?", "retrieved_context_ids": [f"d{i}", "x"]} for i in range(100)]
    data = tmp_path / "eval.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q0 0 d0 1\n")
    out = tmp_path / "out"
    refused = run(str(data), "-o", str(out), "--metric", "retrieval_ids", "--qrels", str(qrels))
    assert refused.exit_code == 2, refused.output
    message = " ".join(refused.output.split())
    assert "--qrels: 1 of 100 row ids found" in message and str(qrels) in message, message
    assert "--on-missing skip" in message and not out.exists()

    allowed = run(str(data), "-o", str(out), "--metric", "retrieval_ids", "--qrels", str(qrels), "--on-missing", "skip")
    assert allowed.exit_code == 0, allowed.output
    said = " ".join(allowed.output.split())
    assert "note: --qrels: 1 of 100 row ids found" in said and "99 others" in said, said
    got = results(out)
    assert got["q0"]["score"] == 1.0 and not got["q0"]["skipped"]
    skipped = [r for rid, r in got.items() if rid != "q0"]
    assert len(skipped) == 99 and all(r["skipped"] for r in skipped)
    reason = f"not assessed: no relevant document ids for this row id in --qrels {qrels}"  # the source named
    assert {r["reason"] for r in skipped} == {reason}
