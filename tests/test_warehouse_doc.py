"""docs/warehouse.md's schema contract is the code's: every column of results, runs, comparisons and calibrations,
in order, with its Arrow type and nullability, as io/schemas.py defines them."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest

from recall_tasks.io.schemas import CALIBRATION_FIELDS, COMPARISON_SCHEMA, RESULT_FIELDS, RUN_FIELDS

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
    "results": [*RESULT_FIELDS, pa.field("dataset", pa.string()), pa.field("run_date", pa.string())],
    "runs": RUN_FIELDS,
    "comparisons": list(COMPARISON_SCHEMA),
    "calibrations": CALIBRATION_FIELDS,
}


@pytest.mark.parametrize("table", sorted(CODE))
def test_the_documented_columns_are_the_code_s(table: str) -> None:
    assert documented(table) == [(f.name, label(f.type), f.nullable) for f in CODE[table]]
