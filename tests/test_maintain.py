"""``recall-bench maintain`` on Delta and Iceberg outputs: fewer files, the same rows, and a rerun of a committed
run still appends nothing (Delta: the app transaction survives the checkpoint; Iceberg: the run id is looked for
in the rows once snapshots were expired)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from recall_tasks.cli.app import app
from recall_tasks.io.results import ChunkPart, ResultStore
from recall_tasks.io.storage import StorageConfig


def night(store: ResultStore, n: int) -> tuple[str, ChunkPart]:
    run_id = f"run-{n:03d}"
    path = store.chunk_path(f"{n:02d}" * 16, run_id)
    store.write_chunk(path, pa.table({"row_id": ["a", "b", "c"], "score": [1.0, 0.5, float(n)], "team": ["x"] * 3}))
    part = ChunkPart(path)
    day = f"2026-11-{1 + n // 2:02d}"  # two nights per partition: compaction has files to merge
    store.commit(run_id, "golden", day, [part], [{"run_id": run_id, "dataset": "golden", "rows": 3}])
    return run_id, part


def files_under(path: Path) -> int:
    return sum(1 for p in path.rglob("*.parquet"))


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_maintain_compacts_keeps_every_row_and_reruns_stay_once(tmp_path, fmt):
    out = tmp_path / "out"
    store = ResultStore(str(out), StorageConfig.from_options(), fmt)  # type: ignore[arg-type]
    nights = [night(store, n) for n in range(6)]
    rows_before = sorted(map(str, store.read_table("results").to_table().to_pylist()))
    files_before = files_under(out / "results")

    done = CliRunner().invoke(app, ["maintain", "-o", str(out), "--keep-days", "0"], env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    assert "results" in done.output and "runs" in done.output

    again = ResultStore(str(out), StorageConfig.from_options(), fmt)  # type: ignore[arg-type]
    assert sorted(map(str, again.read_table("results").to_table().to_pylist())) == rows_before
    assert files_under(out / "results") < files_before
    assert (
        len(
            again.read_table("results").files
            if fmt == "delta"
            else list(again.iceberg.table("results").scan().plan_files())
        )
        == 3
    )  # one file per (dataset, day) partition
    run_id, part = nights[-1]
    again.commit(run_id, "golden", "2026-11-03", [part], [{"run_id": run_id, "dataset": "golden", "rows": 3}])
    assert again.read_table("results").count_rows() == 18 and again.read_table("runs").count_rows() == 6
    night(again, 6)  # and the next night commits as usual
    assert again.read_table("runs").count_rows() == 7


def test_maintain_refuses_parquet_and_empty_outputs(tmp_path):
    store = ResultStore(str(tmp_path / "pq"), StorageConfig.from_options(), "parquet")
    night(store, 0)
    refused = CliRunner().invoke(app, ["maintain", "-o", str(tmp_path / "pq")])
    assert refused.exit_code == 2 and "parquet files are never rewritten" in refused.output
    empty = CliRunner().invoke(app, ["maintain", "-o", str(tmp_path / "none")])
    assert empty.exit_code == 2 and "no tables under" in empty.output
