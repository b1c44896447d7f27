"""Labelled sets (recall_tasks/io/labels.py): both shapes, JSONL and Parquet, and one clear error per bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recall_tasks.errors import DatasetError, StorageError
from recall_tasks.io.labels import load_labels

DATA = Path(__file__).parent / "data"

ROWS: list[dict[str, Any]] = [
    {
        "row_id": "r1",
        "question": "Who wrote Hamlet?",
        "expected_output": "Shakespeare wrote Hamlet. It was written around 1600.",
        "contexts": ["Hamlet is a tragedy by William Shakespeare."],
        "sentences": ["Shakespeare wrote Hamlet.", "It was written around 1600."],
        "labels": [True, False],
        "category": "literature",
    },
    {
        "row_id": "r2",
        "question": "Where is Paris?",
        "expected_output": "Paris is in France.",
        "contexts": ["Paris is the capital of France."],
        "labels": [True],
    },
    {
        "row_id": "r3",
        "question": "Capital of Peru?",
        "expected_output": "Lima is the capital. It is on the coast.",
        "contexts": ["Lima is Peru's capital."],
        "expected_score": 0.5,
        "category": "geography",
    },
]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_dataset_shape_from_jsonl_and_parquet_alike(tmp_path: Path) -> None:
    from_json = load_labels(write_jsonl(tmp_path / "set.jsonl", ROWS))
    keys = list(dict.fromkeys(k for r in ROWS for k in r))
    pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in ROWS]), tmp_path / "set.parquet")
    from_parquet = load_labels(str(tmp_path / "set.parquet"))
    assert from_json.shape == "dataset" and from_json.name == "set"
    assert [r.key for r in from_json.rows] == ["r1", "r2", "r3"]
    r1, r2, r3 = from_json.rows
    assert r1.units == ["Shakespeare wrote Hamlet.", "It was written around 1600."] and r1.labels == [True, False]
    assert r1.row == {
        "input": "Who wrote Hamlet?",
        "expected_output": "Shakespeare wrote Hamlet. It was written around 1600.",
        "retrieval_context": ["Hamlet is a tragedy by William Shakespeare."],
        "actual_output": None,
    }
    assert r1.category == "literature" and r1.human_score == 0.5 and r1.task == "contextual_recall"
    assert r2.units == ["Paris is in France."] and r2.category is None  # units from the splitter
    assert r3.labels is None and r3.human_score == 0.5 and r3.units == ["Lima is the capital.", "It is on the coast."]
    assert from_json.units == 3
    assert [(r.row, r.units, r.labels, r.expected_score) for r in from_parquet.rows] == [
        (r.row, r.units, r.labels, r.expected_score) for r in from_json.rows
    ]
    assert from_parquet.fingerprint == from_json.fingerprint  # the content, not the file format


def test_sentences_alone_make_the_reference(tmp_path: Path) -> None:
    row = {"context": ["x"], "sentences": ["Bees make honey.", "Ants do not."], "labels": [True, False]}
    s = load_labels(write_jsonl(tmp_path / "s.jsonl", [row]))
    assert s.rows[0].row["expected_output"] == "Bees make honey. Ants do not."
    assert s.rows[0].key == "#0"


def test_coverage_rows_and_a_mixed_set(tmp_path: Path) -> None:
    rows = [
        {"task": "context_coverage", "answer": "Jupiter has 95 moons.", "contexts": ["Jupiter: 95 moons.", "Mars"],
         "labels": [True, False]},
        {"expected_output": "Bees make honey.", "contexts": ["Bees make honey."], "labels": [True]},
    ]  # fmt: skip
    s = load_labels(write_jsonl(tmp_path / "mixed.jsonl", rows))
    assert s.tasks() == ["contextual_recall", "context_coverage"]
    cov = s.rows[0]
    assert cov.task == "context_coverage" and cov.units == ["Jupiter: 95 moons.", "Mars"]
    assert cov.row["actual_output"] == "Jupiter has 95 moons."
    only_cov = load_labels(write_jsonl(tmp_path / "cov.jsonl", rows[:1]), metric="context_coverage")
    assert only_cov.tasks() == ["context_coverage"]


def test_unit_per_row_shape_of_the_lexical_sets() -> None:
    s = load_labels(str(DATA / "lexical_heldout.jsonl"))
    assert s.shape == "unit-per-row" and len(s.rows) == 64 and s.units == 64
    first = s.rows[0]
    assert first.row["expected_output"] == "The Louvre is located in Paris." and first.labels == [True]
    assert first.category == "verbatim" and first.row["input"] == "Where is the Louvre?"
    coverage = [r for r in s.rows if r.task == "context_coverage"]
    assert len(coverage) == 6
    assert coverage[0].row["retrieval_context"] == [coverage[0].units[0]]  # type: ignore[index]
    assert sum(r.labels == [True] for r in s.rows) == 37  # 37 "yes", 27 "no" in the file
    assert len(load_labels(str(DATA / "lexical_labelled.jsonl")).rows) == 170


def test_column_overrides(tmp_path: Path) -> None:
    row = {"q": "?", "ref": "Bees make honey.", "ctx": ["Bees make honey."], "labels": [True]}
    path = write_jsonl(tmp_path / "o.jsonl", [row])
    s = load_labels(path, overrides={"input": "q", "expected_output": "ref", "retrieval_context": "ctx"})
    assert s.rows[0].row["input"] == "?" and s.rows[0].units == ["Bees make honey."]
    with pytest.raises(DatasetError, match=r"no expected_output column for contextual_recall"):
        load_labels(path)


def _bad(tmp_path: Path, **change: Any) -> str:
    rows = [dict(r) for r in ROWS]
    for key, value in change.items():
        if value is None:
            rows[1].pop(key, None)
        else:
            rows[1][key] = value
    return write_jsonl(tmp_path / "bad.jsonl", rows)


@pytest.mark.parametrize(
    ("change", "message", "column"),
    [
        ({"labels": [True, False]}, "2 labels for 1 sentences in the reference", "labels"),
        ({"labels": ["yes"]}, "expected a list of booleans", "labels"),
        (
            {"sentences": ["Paris is in France"]},
            "sentence 1 is 'Paris is in France' but the splitter gives",
            "sentences",
        ),
        ({"sentences": ["Paris is", "in France."]}, "sentences differ from the reference's sentences", "sentences"),
        ({"contexts": "Paris is the capital of France."}, "expected a list of strings, found str", "contexts"),
        ({"contexts": []}, "empty context", "contexts"),
        ({"expected_output": 3}, "expected a string, found int", "expected_output"),
        ({"labels": None}, "no human verdict: give labels or expected_score", "labels"),
        ({"expected_score": 1.5}, "expected a number in 0..1, found 1.5", "expected_score"),
        ({"row_id": "r1"}, "row_id 'r1' already used by row 0", "row_id"),
        ({"task": "precision"}, "unknown task 'precision'", "task"),
        ({"category": 7}, "expected a string, found int", "category"),
    ],
)
def test_a_bad_row_is_one_error_naming_file_row_and_column(
    tmp_path: Path, change: dict[str, Any], message: str, column: str
) -> None:
    path = _bad(tmp_path, **change)
    with pytest.raises(DatasetError) as info:
        load_labels(path)
    text = str(info.value)
    assert message in text
    assert f"(file {path}, row 1, column {column!r})" in text


SHADOW = "root:$6$saltsalt$hashhashhash:19000:0:99999:7:::"
UNIT = {"task": "contextual_recall", "statement": "Paris is in France.", "evidence": ["Paris is in France."]}


@pytest.mark.parametrize(
    ("rows", "column"),
    [
        ([dict(UNIT, label="yes"), dict(UNIT, label=SHADOW)], "label"),
        ([ROWS[0], dict(ROWS[1], expected_score=SHADOW, labels=None)], "expected_score"),
        ([ROWS[0], dict(ROWS[1], sentences=[SHADOW])], "sentences"),
    ],
    ids=["label", "expected_score", "sentences"],
)
def test_a_bad_value_is_named_and_quoted_cut_short(tmp_path: Path, rows: list[dict[str, Any]], column: str) -> None:
    """The offending field is named by file, row and column; at most a short prefix of it is quoted (issue 58)."""
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DatasetError) as info:
        load_labels(path)
    text = str(info.value)
    assert f"(file {path}, row 1, column {column!r})" in text and "root:$6$" in text, text
    assert SHADOW not in text and ":99999:7:::" not in text, text


def test_bad_files(tmp_path: Path) -> None:
    (tmp_path / "broken.jsonl").write_text('{"labels": [true]}\n{"labels": [tru\n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"line 2 is not JSON: .*\(file .*broken.jsonl\)"):
        load_labels(str(tmp_path / "broken.jsonl"))
    (tmp_path / "list.jsonl").write_text("[1, 2]\n", encoding="utf-8")
    with pytest.raises(DatasetError, match="line 1 is a JSON list, not an object"):
        load_labels(str(tmp_path / "list.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(DatasetError, match="labelled set has no rows"):
        load_labels(str(tmp_path / "empty.jsonl"))
    (tmp_path / "fake.parquet").write_bytes(b"not parquet")
    with pytest.raises(DatasetError, match="not a readable Parquet file"):
        load_labels(str(tmp_path / "fake.parquet"))
    with pytest.raises(DatasetError, match="one .jsonl .* or .parquet .* file"):
        load_labels(str(tmp_path / "set.csv"))
    with pytest.raises(StorageError, match="labelled set not found"):
        load_labels(str(tmp_path / "absent.jsonl"))
    no_labels = write_jsonl(tmp_path / "nolabels.jsonl", [{"expected_output": "A.", "contexts": ["A."]}])
    with pytest.raises(DatasetError, match=r"no labels: .*column 'labels'"):
        load_labels(no_labels)
    two = write_jsonl(
        tmp_path / "two.jsonl", [{"statement": "Bees make honey. They fly far.", "evidence": ["x"], "label": "yes"}]
    )
    with pytest.raises(DatasetError, match=r"splits into 2 sentences.*row 0, column 'statement'"):
        load_labels(two)
    label = write_jsonl(tmp_path / "label.jsonl", [{"statement": "A is B.", "evidence": ["x"], "label": "maybe"}])
    with pytest.raises(DatasetError, match=r"expected \"yes\", \"no\" or a boolean, found 'maybe'"):
        load_labels(label)
