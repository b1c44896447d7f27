"""Qrels files (recall_tasks/io/qrels.py): TREC text and Parquet, their bad inputs, the join to rows by row id."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recall_tasks.errors import DatasetError, StorageError
from recall_tasks.io.qrels import qrels_for, read_qrels, refuse_unmatched, unmatched_queries
from recall_tasks.io.storage import StorageConfig
from recall_tasks.metrics.ids_compute import id_metrics, normalise_ids

TREC = """\
q1 0 doc-1 2
q1 0 doc-2 0

# a comment, then tabs and a repeated judgement
q2\t0\tdoc-9\t1
q1 0 doc-3 1
q2 Q0 doc-9 1
"""


def write_text(tmp_path: Path, text: str, name: str = "qrels.txt") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def write_parquet(tmp_path: Path, columns: dict[str, pa.Array], name: str = "qrels.parquet") -> str:
    path = tmp_path / name
    pq.write_table(pa.table(columns), path)
    return str(path)


def test_trec_text(tmp_path: Path) -> None:
    qrels = read_qrels(write_text(tmp_path, TREC))
    assert qrels.query_ids.to_pylist() == ["q1", "q2"]
    assert qrels.doc_ids.to_pylist() == [["doc-1", "doc-2", "doc-3"], ["doc-9"]]  # the repeated pair kept once
    assert qrels.relevance.to_pylist() == [[2, 0, 1], [1]]


def test_compressed_trec_text(tmp_path: Path) -> None:
    path = tmp_path / "qrels.txt.gz"
    path.write_bytes(gzip.compress(TREC.encode()))
    assert read_qrels(str(path)).relevance.to_pylist() == [[2, 0, 1], [1]]


def test_parquet_with_integer_ids_and_whole_float_grades(tmp_path: Path) -> None:
    uri = write_parquet(
        tmp_path,
        {"query_id": pa.array([7, 7, 8]), "doc_id": pa.array([1, 2, 1]), "relevance": pa.array([1.0, 3.0, 0.0])},
        name="judged.bin",  # sniffed by its PAR1 magic, not its name
    )
    qrels = read_qrels(uri)
    assert qrels.query_ids.to_pylist() == ["7", "8"]
    assert qrels.doc_ids.to_pylist() == [["1", "2"], ["1"]]
    assert qrels.relevance.to_pylist() == [[1, 3], [0]]


def test_parquet_without_relevance_is_binary(tmp_path: Path) -> None:
    qrels = read_qrels(write_parquet(tmp_path, {"query_id": pa.array(["a"]), "doc_id": pa.array(["x"])}))
    assert qrels.relevance.to_pylist() == [[1]]


def test_qrels_on_s3(s3_server, s3_bucket: str) -> None:  # type: ignore[no-untyped-def]
    storage = StorageConfig.from_options(s3_server.storage_options())
    s3_server.client().put_object(Bucket=s3_bucket, Key="judged/qrels.txt", Body=TREC.encode())
    qrels = read_qrels(f"s3://{s3_bucket}/judged/qrels.txt", storage)
    assert qrels.doc_ids.to_pylist() == [["doc-1", "doc-2", "doc-3"], ["doc-9"]]
    with pytest.raises(StorageError, match="not found|NoSuchKey|does not exist"):
        read_qrels(f"s3://{s3_bucket}/judged/missing.txt", storage)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("q1 0 doc-1 1\nq1 0 doc-2\n", "malformed qrels line 2: 3 fields"),
        ("q1 0 doc-1 1 extra\n", "malformed qrels line 1: 5 fields"),
        ("q1 0 doc-1 1\nq1 0 doc-2 -1\n", "qrels line 2: relevance -1 is negative"),
        ("q1 0 doc-1 1.5\n", "qrels line 1: relevance '1.5' is not an integer"),
        ("q1 0 doc-1 high\n", "qrels line 1: relevance 'high' is not an integer"),
        (
            "q1 0 doc-1 1\n\nq1 0 doc-1 2\n",
            "query 'q1' doc 'doc-1' twice with different relevance: 1 on line 1, 2 on line 3",
        ),
        ("\n# nothing\n", "no judgements"),
    ],
)
def test_bad_text_names_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    uri = write_text(tmp_path, text)
    with pytest.raises(DatasetError, match=re.escape(message)) as info:
        read_qrels(uri)
    assert f"file {uri}" in str(info.value)


#: A line of /etc/shadow: what ``--qrels /etc/shadow`` used to print the first 80 characters of.
SHADOW = "root:$6$saltsalt$hashhashhash:19000:0:99999:7:::"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"q1 0 doc-1 1\n{SHADOW}\n", "malformed qrels line 2: 1 field, expected 4 (query_id 0 doc_id relevance"),
        (f"q1 0 doc-1 1\n{SHADOW} 0 x\n", "malformed qrels line 2: 3 fields, expected 4 (query_id 0 doc_id"),
        (f"q1 0 doc-1 1\nq1 0 doc-2 {SHADOW}\n", "qrels line 2: relevance 'root:$6$'... is not an integer"),
    ],
    ids=["one-field", "three-fields", "relevance"],
)
def test_an_error_names_the_file_line_and_field_not_the_lines_text(tmp_path: Path, text: str, message: str) -> None:
    uri = write_text(tmp_path, text, name="shadow")
    with pytest.raises(DatasetError) as info:
        read_qrels(uri)
    said = str(info.value)
    assert message in said and f"file {uri}" in said, said
    assert SHADOW not in said and "saltsalt" not in said and "hashhash" not in said, said


def test_a_conflict_names_ids_cut_short(tmp_path: Path) -> None:
    long_id = "d" * 500
    uri = write_text(tmp_path, f"q1 0 {long_id} 1\nq1 0 {long_id} 2\n")
    with pytest.raises(DatasetError, match=f"doc '{'d' * 80}'... twice with different relevance") as info:
        read_qrels(uri)
    assert "d" * 81 not in str(info.value)


def test_binary_that_is_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "qrels.txt"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(DatasetError, match="not UTF-8 text nor Parquet"):
        read_qrels(str(path))


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"query_id": ["a", "a"], "doc_id": ["x", "y"], "relevance": [1, -2]}, "negative .*row 1.*'relevance'"),
        ({"query_id": ["a", "a"], "doc_id": ["x", "y"], "relevance": [1.0, 0.5]}, "not an integer .*row 1"),
        ({"query_id": ["a", "a"], "doc_id": ["x", "y"], "relevance": [1, None]}, "relevance is null .*row 1"),
        ({"query_id": ["a", "a"], "doc_id": ["x", "y"], "relevance": ["1", "2"]}, "non-negative integer; found string"),
        ({"query_id": ["a", None], "doc_id": ["x", "y"], "relevance": [1, 1]}, "id is null .*row 1.*'query_id'"),
        ({"query_id": ["a", "b"], "doc_id": [1.0, 2.0], "relevance": [1, 1]}, "floats are not ids .*'doc_id'"),
        (
            {"query_id": ["a", "a"], "doc_id": ["x", "x"], "relevance": [1, 0]},
            "different relevance: 1 on row 0, 0 on row 1",
        ),
        ({"query": ["a"], "doc_id": ["x"]}, "lacks query_id"),
    ],
)
def test_bad_parquet_names_file_and_row(tmp_path: Path, columns: dict[str, list[object]], message: str) -> None:
    uri = write_parquet(tmp_path, {name: pa.array(values) for name, values in columns.items()})
    with pytest.raises(DatasetError, match=message) as info:
        read_qrels(uri)
    assert f"file {uri}" in str(info.value)


def test_missing_file_is_a_storage_error(tmp_path: Path) -> None:
    with pytest.raises(StorageError):
        read_qrels(str(tmp_path / "nope.txt"))


def test_join_by_row_id(tmp_path: Path) -> None:
    qrels = read_qrels(write_text(tmp_path, "7 0 d1 1\n7 0 d2 0\n9 0 d3 2\n"))
    row_ids = pa.chunked_array([pa.array(["9", "8"]), pa.array(["7"])])
    docs, grades = qrels_for(qrels, row_ids)
    assert docs.to_pylist() == [["d3"], None, ["d1", "d2"]]
    assert grades.to_pylist() == [[2], None, [1, 0]]
    assert unmatched_queries(qrels, row_ids) == []
    refuse_unmatched(qrels, row_ids)
    # joined rows go straight into the metrics: the row without judgements is not assessed
    retrieved = normalise_ids(pa.array([["d3"], ["d1"], ["d2", "d1"]]), column="r", source="f")
    table = id_metrics(retrieved, docs, grades, [1])
    assert table.column("mrr@1").to_pylist() == [1.0, None, 0.0]


def test_query_ids_matching_no_row_are_refused(tmp_path: Path) -> None:
    uri = write_text(tmp_path, "".join(f"q{i} 0 d 1\n" for i in range(9)))
    qrels = read_qrels(uri)
    rows = ["q0", "q2", "other"]
    assert unmatched_queries(qrels, rows) == ["q1", "q3", "q4", "q5", "q6", "q7", "q8"]
    with pytest.raises(
        DatasetError, match=r"7 of the 9 qrels query ids match no row id .*'q1', 'q3', 'q4', 'q5', 'q6' and 2 more"
    ) as info:
        refuse_unmatched(qrels, rows)
    assert f"file {uri}" in str(info.value) and "row_id column" in str(info.value)


def test_the_first_conflict_in_the_file_is_named(tmp_path: Path) -> None:
    text = "b 0 y 1\na 0 x 1\nb 0 y 1\na 0 x 3\nb 0 y 2\n"
    with pytest.raises(
        DatasetError, match=re.escape("query 'a' doc 'x' twice with different relevance: 1 on line 2, 3 on line 4")
    ):
        read_qrels(write_text(tmp_path, text))


def test_query_ids_matching_no_row_are_quoted_cut_short(tmp_path: Path) -> None:
    """A file given as --qrels by mistake (four fields a line, an integer last) is refused before any work: its
    lines' first fields are quoted at most 40 characters each."""
    from recall_tasks.config import RunParams
    from recall_tasks.errors import ConfigError
    from recall_tasks.pipeline.steps import check_run

    secret = "s3cr3t-" + "k" * 60
    qrels = write_text(tmp_path, f"{secret} x y 1\n")
    data = tmp_path / "eval.parquet"
    pq.write_table(pa.Table.from_pylist([{"row_id": "r1", "question": "q", "answer": "a", "contexts": ["c"],
                                          "retrieved_context_ids": ["d1"]}]), data)  # fmt: skip
    params = RunParams(dataset_uri=str(data), output_uri=str(tmp_path / "out"), metric="retrieval_ids",
                       qrels_uri=qrels)  # fmt: skip
    with pytest.raises(ConfigError, match="0 of 1 row ids found") as info:
        check_run(params, contact=False)
    assert f"query ids such as {secret[:40]!r}..." in str(info.value) and secret not in str(info.value)
