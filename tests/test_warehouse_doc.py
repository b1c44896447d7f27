"""docs/warehouse.md's schema contract is the code's: every column of results, runs, comparisons and calibrations,
in order, with its Arrow type and nullability, as io/schemas.py defines them; and its offline recipes run as written."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow as pa
import pytest

from recall_tasks.io.schemas import CALIBRATION_FIELDS, COMPARISON_SCHEMA, LABEL_FIELD, RESULT_FIELDS, RUN_FIELDS

DOC = Path(__file__).resolve().parents[1] / "docs" / "warehouse.md"
ROW = re.compile(r"^\| `(?P<name>[^`]+)` \| `(?P<type>[^`]+)`(?P<required> not null)? \| (?P<meaning>.*) \|$")


def label(t: pa.DataType) -> str:
    if pa.types.is_list(t):
        return f"list<{label(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(f"{f.name}: {label(f.type)}" for f in t) + ">"
    if pa.types.is_timestamp(t):
        return f"timestamp[{t.unit}, {t.tz}]"
    return str(t)


def documented(table: str) -> list[tuple[str, str, bool]]:
    section = DOC.read_text().split(f"\n### {table}\n", 1)[1].split("\n#", 1)[0]
    rows = [m for line in section.splitlines() if (m := ROW.match(line))]
    assert all(m["meaning"].strip() for m in rows), f"{table}: a column without its meaning"
    return [(m["name"], m["type"], not m["required"]) for m in rows]


CODE = {
    "results": [*RESULT_FIELDS, pa.field("dataset", pa.string()), pa.field("run_date", pa.string()), LABEL_FIELD],
    "runs": RUN_FIELDS,
    "comparisons": list(COMPARISON_SCHEMA),
    "calibrations": CALIBRATION_FIELDS,
}


@pytest.mark.parametrize("table", sorted(CODE))
def test_the_documented_columns_are_the_code_s(table: str) -> None:
    assert documented(table) == [(f.name, label(f.type), f.nullable) for f in CODE[table]]


def offline_recipes() -> dict[str, str]:
    """The Python blocks of the doc's "Offline" section, by the format they read."""
    section = DOC.read_text().split("\n## Offline: Python from the installed environment\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    return {"delta" if "deltalake" in code else "iceberg": code for code in blocks}


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
@pytest.mark.concurrency
def test_the_offline_recipes_read_a_real_output_as_written(prefect_harness, tmp_path, fmt):
    """Each recipe, run as written next to a real run's ``recall-output``, prints that run's overall row."""
    import json
    import subprocess
    import sys
    from importlib import resources

    import pyarrow.parquet as pq

    from recall_tasks.config import RunParams
    from recall_tasks.pipeline.flow import recall_benchmark

    lines = resources.files("recall_tasks").joinpath("data", "sample.jsonl").read_text("utf-8").splitlines()
    data = tmp_path / "data" / "sample.parquet"
    data.parent.mkdir()
    pq.write_table(pa.Table.from_pylist([json.loads(line) for line in lines if line]), data)
    summary = recall_benchmark(
        RunParams(dataset_uri=str(data), output_uri=str(tmp_path / "recall-output"), judge="lexical",
                  format=fmt, label="offline-doc", on_missing="skip", segment_by=["category"])
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYICEBERG_"))}
    done = subprocess.run(
        [sys.executable, "-c", offline_recipes()[fmt]], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "offline-doc" in done.stdout and summary["run_id"] in done.stdout and "0.5" in done.stdout
    assert done.stdout.count(summary["run_id"]) == 1  # the overall row only: segments filtered out


def any_catalog_recipe() -> tuple[str, str]:
    """The "Iceberg from Python, any catalog" recipe: its shell block (the catalog's variables), its Python block."""
    text = DOC.read_text().split("\nIceberg from Python, any catalog", 1)[1].split("\n## ", 1)[0]
    shell = re.findall(r"```bash\n(.*?)```", text, re.S)
    python = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(shell) == 1 and len(python) == 1
    return shell[0], python[0]


@pytest.mark.concurrency
def test_the_any_catalog_recipe_reads_a_rest_catalog_on_an_s3_compatible_store(
    prefect_harness, s3_server, tmp_path, monkeypatch
):
    """Run as written (its shell block, then its Python) in a shell holding what the doc says a user has: the
    ``AWS_*`` variables of the store and the ``PYICEBERG_CATALOG__LAKE__*`` ones of the catalog (a SeaweedFS REST
    catalog): it prints the run's row count."""
    import json
    import shlex
    import subprocess
    import sys
    from importlib import resources

    import pyarrow.parquet as pq

    from recall_tasks.config import RunParams
    from recall_tasks.pipeline.flow import recall_benchmark

    lines = resources.files("recall_tasks").joinpath("data", "sample.jsonl").read_text("utf-8").splitlines()
    data = tmp_path / "sample.parquet"
    pq.write_table(pa.Table.from_pylist([json.loads(line) for line in lines if line]), data)
    user = {**s3_server.env(), **s3_server.iceberg_catalog_env("lake")}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYICEBERG_"))} | user
    for k, v in user.items():
        monkeypatch.setenv(k, v)
    summary = recall_benchmark(
        RunParams(dataset_uri=str(data), output_uri=f"s3://{s3_server.make_bucket()}/out", judge="lexical",
                  format="iceberg", catalog="lake", on_missing="skip")
    )  # fmt: skip
    shell, python = any_catalog_recipe()
    code = f"set -e\n{shell}\n{shlex.quote(sys.executable)} -c {shlex.quote(python)}\n"
    done = subprocess.run(["bash", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary["run_id"] in done.stdout, done.stdout
