"""The id-based retrieval metrics (recall_tasks/metrics/ids_compute.py) against trec_eval, through ir-measures.

The reference is ir-measures' pytrec_eval provider (trec_eval's C code): P_k, recall_k, success_k, ndcg_cut_k per
query; MRR@k is trec_eval's recip_rank on the run cut to its first k documents (pytrec_eval has no recip_rank cut).
A run is given to it as one score per document, decreasing with the rank, so trec_eval's order is the list's.
"""

from __future__ import annotations

import math
import random
import re
from typing import Any

import ir_measures
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ir_measures import RR, P, R, Success, nDCG

from recall_tasks.errors import ConfigError, DatasetError
from recall_tasks.metrics.ids_compute import (
    METRICS,
    id_metrics,
    metric_names,
    normalise_ids,
    normalise_relevance,
    parse_ks,
)

PROPERTY = {"deadline": None, "database": None, "derandomize": True, "suppress_health_check": [HealthCheck.too_slow]}
OTHER_THREADS_RANDOM = pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")
TOLERANCE = 1e-9

Row = tuple[list[Any], list[Any], list[int] | None]


def _qrels_run(rows: list[Row]) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]], dict[str, list[str]]]:
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, dict[str, float]] = {}
    order: dict[str, list[str]] = {}
    for i, (retrieved, relevant, grades) in enumerate(rows):
        qid = f"q{i}"
        judged: dict[str, int] = {}
        for j, doc in enumerate(relevant):
            grade = 1 if grades is None else grades[j]
            judged[str(doc)] = max(grade, judged.get(str(doc), grade))
        if judged:
            qrels[qid] = judged
        unique = list(dict.fromkeys(str(d) for d in retrieved))
        if unique:
            run[qid] = {doc: float(len(unique) - r) for r, doc in enumerate(unique)}
            order[qid] = unique
    return qrels, run, order


def reference(rows: list[Row], ks: list[int]) -> dict[str, list[float | None]]:
    """Every metric per row from trec_eval; None where the row has no relevant id (not assessed)."""
    qrels, run, order = _qrels_run(rows)
    measures = [m @ k for k in ks for m in (P, R, Success, nDCG)]
    got: dict[tuple[str, str], float] = {}
    if qrels and run:
        for metric in ir_measures.pytrec_eval.evaluator(measures, qrels).iter_calc(run):
            got[(metric.query_id, str(metric.measure))] = metric.value
        for k in ks:
            cut = {q: {d: s for d, s in docs.items() if d in order[q][:k]} for q, docs in run.items()}
            for metric in ir_measures.pytrec_eval.evaluator([RR], qrels).iter_calc(cut):
                got[(metric.query_id, f"RR@{k}")] = metric.value
    names = {"recall": "R@{}", "precision": "P@{}", "hit_rate": "Success@{}", "mrr": "RR@{}", "ndcg": "nDCG@{}"}
    out: dict[str, list[float | None]] = {name: [] for name in metric_names(ks)}
    for i in range(len(rows)):
        qid = f"q{i}"
        assessed = any(g > 0 for g in qrels.get(qid, {}).values())
        for metric in METRICS:
            for k in ks:
                value: float | None = None
                if assessed:
                    # trec_eval skips a query the run lacks: it retrieved nothing, every metric 0
                    value = got[(qid, names[metric].format(k))] if qid in run else 0.0
                out[f"{metric}@{k}"].append(value)
    return out


def ours(rows: list[Row], ks: list[int], *, graded: bool, ints: tuple[bool, bool] = (False, False)) -> pa.Table:
    def ids(lists: list[list[Any]], as_int: bool) -> pa.ListArray:
        typ = pa.list_(pa.int64()) if as_int else pa.list_(pa.string())
        raw = pa.array([[d if as_int else str(d) for d in lst] for lst in lists], typ)
        return normalise_ids(raw, column="ids", source="mem")

    retrieved = ids([r[0] for r in rows], ints[0])
    relevant = ids([r[1] for r in rows], ints[1])
    relevance = None
    if graded:
        raw = pa.array([r[2] for r in rows], pa.list_(pa.int64()))
        relevance = normalise_relevance(raw, relevant, column="relevance", source="mem")
    return id_metrics(retrieved, relevant, relevance, ks)


def assert_equal(table: pa.Table, expected: dict[str, list[float | None]], rows: list[Row]) -> None:
    assert table.column_names == list(expected)
    for name, want in expected.items():
        got = table.column(name).to_pylist()
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert (a is None) == (b is None), (name, i, a, b, rows[i])
            if a is not None and b is not None:
                assert math.isclose(a, b, rel_tol=0, abs_tol=TOLERANCE), (name, i, a, b, rows[i])


@st.composite
def _row(draw: st.DrawFn, graded: bool) -> Row:
    doc = st.integers(min_value=0, max_value=draw(st.sampled_from([2, 12])))  # a small pool: many repeats
    retrieved = draw(st.lists(doc, max_size=14))  # repeats: duplicates in the retrieved list
    relevant = draw(st.lists(doc, max_size=8))
    grades = draw(st.lists(st.integers(0, 3), min_size=len(relevant), max_size=len(relevant))) if graded else None
    return retrieved, relevant, grades


_KS = st.lists(st.integers(1, 16), min_size=1, max_size=4, unique=True)


@OTHER_THREADS_RANDOM
@settings(max_examples=300, **PROPERTY)
@given(st.lists(_row(graded=False), min_size=1, max_size=12), _KS, st.tuples(st.booleans(), st.booleans()))
def test_binary_relevance_equals_trec_eval(rows: list[Row], ks: list[int], ints: tuple[bool, bool]) -> None:
    assert_equal(ours(rows, ks, graded=False, ints=ints), reference(rows, ks), rows)


@OTHER_THREADS_RANDOM
@settings(max_examples=300, **PROPERTY)
@given(st.lists(_row(graded=True), min_size=1, max_size=12), _KS, st.tuples(st.booleans(), st.booleans()))
def test_graded_relevance_equals_trec_eval(rows: list[Row], ks: list[int], ints: tuple[bool, bool]) -> None:
    """Ties of grades in the ideal ranking, grade 0 (judged, not relevant), an id judged twice (its highest grade)."""
    assert_equal(ours(rows, ks, graded=True, ints=ints), reference(rows, ks), rows)


@pytest.mark.parametrize("ks", [[1, 10, 100, 999, 1000, 5000], [1, 5, 10]])
def test_thousand_id_lists_equal_trec_eval(ks: list[int]) -> None:
    """Long lists; with small ks only each list's head is read, and the rows whose head repeats ids (drawn from a
    pool of 12) are read whole again."""
    rng = random.Random(41)
    rows: list[Row] = []
    for i in range(60):
        pool = 12 if i % 3 == 0 else 3000
        retrieved = [rng.randrange(pool) for _ in range(1000)]
        relevant = rng.sample(range(pool), rng.randrange(1, min(pool, 300)))
        rows.append((retrieved, relevant, [rng.randrange(0, 4) for _ in relevant]))
    assert_equal(ours(rows, ks, graded=True), reference(rows, ks), rows)


def test_known_values() -> None:
    """One worked row: retrieved c d a a b, relevant a(2) b(0) c(1) z(3)."""
    rows: list[Row] = [(["c", "d", "a", "a", "b"], ["a", "b", "c", "z"], [2, 0, 1, 3])]
    got = ours(rows, [1, 2, 3], graded=True).to_pylist()[0]
    assert got["precision@2"] == 0.5 and got["precision@3"] == pytest.approx(2 / 3)
    assert got["recall@1"] == pytest.approx(1 / 3) and got["recall@3"] == pytest.approx(2 / 3)
    assert got["hit_rate@1"] == 1.0 and got["mrr@3"] == 1.0
    ideal = 3 + 2 / math.log2(3) + 1 / 2
    assert got["ndcg@3"] == pytest.approx((1 + 2 / 2) / ideal)


def test_not_assessed_and_empty_rows() -> None:
    retrieved = pa.array([["a"], ["a"], None, [], ["a"]], pa.list_(pa.string()))
    relevant = pa.array([[], None, ["a"], ["a"], ["a", "b"]], pa.list_(pa.string()))
    relevance = pa.array([[], None, [1], [1], [0, 0]], pa.list_(pa.int64()))
    table = id_metrics(retrieved, relevant, relevance, [1, 5])
    assert table.column_names == metric_names([1, 5])
    assert all(t == pa.float64() for t in table.schema.types)
    for name in table.column_names:
        # empty or null relevant list, or every grade 0: not assessed; nothing retrieved: 0
        assert table.column(name).to_pylist() == [None, None, 0.0, 0.0, None], name


def test_ks_beyond_the_list_and_repeated() -> None:
    table = id_metrics(
        pa.array([["a", "b"]], pa.list_(pa.string())), pa.array([["b"]], pa.list_(pa.string())), None, [100, 100]
    )
    assert table.to_pylist() == [
        {"recall@100": 1.0, "precision@100": 0.01, "hit_rate@100": 1.0, "mrr@100": 0.5, "ndcg@100": 1 / math.log2(3)}
    ]


def test_ids_compare_as_strings() -> None:
    retrieved = normalise_ids(pa.array([[7, 8]], pa.list_(pa.int32())), column="r", source="f")
    relevant = normalise_ids(pa.chunked_array([pa.array([["8", "9"]])]), column="g", source="f")
    assert retrieved.to_pylist() == [["7", "8"]]
    assert id_metrics(retrieved, relevant, None, [2]).column("recall@2").to_pylist() == [0.5]


# --- bad inputs ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("array", "message", "row"),
    [
        (pa.array([["a"], ["b", None]]), "a list holding nulls", 1),
        (pa.array([[1.0], [7.0]]), "floats are not ids", 0),
        (pa.array([[], [True]]), "ids are strings or integers", 1),
        (pa.array(["a", "b"]), "expected a list of ids", 0),
        (pa.array([None, 3]), "expected a list of ids", 1),
        (pa.array([["a"], [], ["x", ""]]), "an id is an empty string", 2),
    ],
)
def test_bad_ids_name_file_row_and_column(array: pa.Array, message: str, row: int) -> None:
    with pytest.raises(DatasetError, match=re.escape(message)) as info:
        normalise_ids(array, column="retrieved_context_ids", source="s3://b/data.parquet", first_row=100)
    text = str(info.value)
    assert "file s3://b/data.parquet" in text and f"row {100 + row}" in text and "'retrieved_context_ids'" in text


def test_null_list_is_no_ids() -> None:
    """A null cell (not a null inside a list) is no ids: retrieved nothing, or not assessed for the relevant ids."""
    got = normalise_ids(pa.array([["1"], None], pa.list_(pa.large_string())), column="c", source="f")
    assert got.type == pa.list_(pa.string()) and got.to_pylist() == [["1"], None]
    nothing = normalise_ids(pa.nulls(2), column="c", source="f")  # a column JSON lines read as all null
    assert nothing.type == pa.list_(pa.string()) and nothing.to_pylist() == [None, None]


def test_chunked_rows_are_counted_across_chunks() -> None:
    chunked = pa.chunked_array([pa.array([["a"], ["b"]]), pa.array([["c"], ["d", None]])])
    with pytest.raises(DatasetError, match="row 3"):
        normalise_ids(chunked, column="c", source="f")


def test_chunk_ids_map_to_document_ids() -> None:
    pattern = re.compile(r"^(.+)::chunk-\d+$")
    raw = pa.array([["doc-42::chunk-3", "doc-42::chunk-1", "doc-7::chunk-0"], None, []])
    got = normalise_ids(raw, column="c", source="f", chunk_to_doc=pattern)
    assert got.to_pylist() == [["doc-42", "doc-42", "doc-7"], None, []]
    metrics = id_metrics(got, pa.array([["doc-7"], ["x"], ["x"]]), None, [2])
    assert metrics.column("recall@2").to_pylist() == [1.0, 0.0, 0.0]  # doc-42's second chunk counts once


def test_chunk_pattern_needs_one_group_and_a_match() -> None:
    raw = pa.array([["doc-1::chunk-0"], ["doc-2::chunk-0", "stray"]])
    for bad in (r"^.+::chunk-\d+$", r"^(.+)::(chunk)-\d+$"):
        with pytest.raises(ConfigError, match="exactly one"):
            normalise_ids(raw, column="c", source="f", chunk_to_doc=re.compile(bad))
    with pytest.raises(DatasetError, match=r"'stray' does not match .*row 1") as info:
        normalise_ids(raw, column="c", source="f", chunk_to_doc=re.compile(r"^(.+)::chunk-\d+$"))
    assert not isinstance(info.value, type(None))


@pytest.mark.parametrize(
    ("grades", "message", "row"),
    [
        (pa.array([[1], [-1]]), "negative", 1),
        (pa.array([[1], [1.5]]), "not an integer", 1),
        (pa.array([[1], [None]], pa.list_(pa.int64())), "is null", 1),
        (pa.array([["1"], ["2"]]), "non-negative integers", 0),
        (pa.array([[1], [1, 2]]), "2 relevance grades for 1 ids", 1),
    ],
)
def test_bad_relevance(grades: pa.Array, message: str, row: int) -> None:
    ids = pa.array([["a"], ["b"]], pa.list_(pa.string()))
    with pytest.raises(DatasetError, match=re.escape(message)) as info:
        normalise_relevance(grades, ids, column="reference_context_relevance", source="d.parquet")
    assert f"row {row}" in str(info.value) and "file d.parquet" in str(info.value)


def test_whole_float_grades_and_null_lists_are_read() -> None:
    ids = pa.array([["a", "b"], ["c"]], pa.list_(pa.string()))
    got = normalise_relevance(pa.array([[2.0, 0.0], None]), ids, column="r", source="f")
    assert got.to_pylist() == [[2, 0], [1]]


@pytest.mark.parametrize(("text", "ks"), [("1,5,10", (1, 5, 10)), ("10, 5,5", (5, 10)), ("3", (3,))])
def test_parse_ks(text: str, ks: tuple[int, ...]) -> None:
    assert parse_ks(text) == ks


@pytest.mark.parametrize("text", ["0", "-1", "a", "", "1,,5", "2.5", "1,0"])
def test_parse_ks_refuses(text: str) -> None:
    with pytest.raises(ConfigError, match="--k"):
        parse_ks(text)


def test_id_metrics_refuses_bad_ks() -> None:
    lists = pa.array([["a"]], pa.list_(pa.string()))
    for ks in ([], [0], [-3]):
        with pytest.raises(ValueError, match="positive"):
            id_metrics(lists, lists, None, ks)


def test_sliced_arrays_and_null_lists_covering_values() -> None:
    """A slice (offsets not from 0) and a null list whose offsets still span values (Arrow allows both)."""
    values = pa.array(["x", "a", "b", "c", "a", "z"])
    offsets = pa.array([0, 1, 3, 5, 6], pa.int32())
    covered = pa.ListArray.from_arrays(offsets, values, mask=pa.array([False, False, True, False]))
    assert covered.to_pylist() == [["x"], ["a", "b"], None, ["z"]]
    retrieved = normalise_ids(covered.slice(1), column="r", source="f")
    relevant = normalise_ids(pa.array([["b"], ["c"], ["z"]], pa.list_(pa.large_string())), column="g", source="f")
    assert retrieved.to_pylist() == [["a", "b"], None, ["z"]]
    table = id_metrics(retrieved, relevant, None, [2])
    assert table.column("mrr@2").to_pylist() == [0.5, 0.0, 1.0]
    with pytest.raises(DatasetError, match="row 1"):
        normalise_ids(
            pa.ListArray.from_arrays(offsets, pa.array(["x", "a", None, "c", "a", "z"]), mask=covered.is_null()),
            column="r", source="f",
        )  # fmt: skip
    # the null list's covered values are not read: its null is no error
    normalise_ids(pa.ListArray.from_arrays(offsets, pa.array(["x", "a", "b", None, "c", "z"]), mask=covered.is_null()),
                  column="r", source="f")  # fmt: skip
