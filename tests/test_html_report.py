"""Tests of recall_tasks.reports.html: content of the rendered document, escaping, edge cases, write_report."""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any

import pyarrow as pa
import pytest

from recall_tasks.errors import ConfigError
from recall_tasks.io.results import RUN_SCHEMA, ResultStore
from recall_tasks.io.schemas import COMPARISON_SCHEMA, RESULT_FIELDS
from recall_tasks.io.storage import StorageConfig
from recall_tasks.reports.html import render_report, write_report

RESULT_SCHEMA = pa.schema([*RESULT_FIELDS, pa.field("input", pa.string()), pa.field("topic", pa.string())])
T0 = dt.datetime(2024, 5, 1, 6, 0, tzinfo=dt.UTC)
XSS = "<script>alert('x')</script>"


def verdicts(yes: list[str], no: list[str]) -> list[dict[str, Any]]:
    return [
        {"statement": s, "verdict": v, "reason": "", "chunk_ids": [0]}
        for v, ss in (("yes", yes), ("no", no))
        for s in ss
    ]


def run_row(run_id: str, day: int, mean: float | None, **kw: Any) -> dict[str, Any]:
    row = {
        "run_id": run_id, "started_at": T0 + dt.timedelta(days=day),
        "finished_at": T0 + dt.timedelta(days=day, minutes=5),
        "dataset": "faq", "label": f"idx-{run_id}", "index_version": f"v{day}", "metric": "contextual_recall",
        "judge_model": "gpt-judge", "prompt_version": "p3", "threshold": 0.5, "rows": 6, "scored": 4, "errors": 1,
        "skipped": 1, "cached": 2, "mean_score": mean, "ci_low": None if mean is None else mean - 0.1,
        "ci_high": None if mean is None else mean + 0.1, "pass_rate": 0.75, "status": "ok",
    }  # fmt: skip
    return {**row, **kw}


def result_row(run_id: str, row_id: str, score: float | None, **kw: Any) -> dict[str, Any]:
    return {"run_id": run_id, "row_id": row_id, "score": score, "success": None if score is None else score >= 0.5,
            "verdicts": [], "skipped": False, "cached": False, **kw}  # fmt: skip


def cmp_row(current: str, baseline: str, verdict: str, **kw: Any) -> dict[str, Any]:
    return {
        "comparison_id": f"{current}__{baseline}", "current_run_id": current, "baseline_run_id": baseline,
        "dataset": "faq", "metric": "contextual_recall", "verdict": verdict, "like_for_like": True, "n_paired": 5,
        "mean_delta": -0.1, "ci_low": -0.18, "ci_high": -0.03, "flips_pass_to_fail": 3, "flips_fail_to_pass": 0,
        "mcnemar_p": 0.0123, "compared_at": T0 + dt.timedelta(days=9), **kw,
    }  # fmt: skip


@pytest.fixture
def runs() -> pa.Table:
    rows = [
        run_row("run-a", 0, 0.70),
        run_row("run-b", 1, 0.75, label=None),
        run_row("run-c", 2, 0.65, scale=1.0),
        run_row("run-c", 2, 0.80, segment_column="topic", segment_value="billing", rows=3),
        run_row("run-c", 2, 0.50, segment_column="topic", segment_value="tech", rows=2),
        run_row("run-c", 2, None, segment_column="topic", segment_value=None, rows=1, ci_low=math.nan),
        run_row("run-x", 1, 0.10, dataset="other"),
        run_row("run-y", 1, 0.20, metric="other_metric"),
        run_row("run-future", 5, 0.90),
    ]
    return pa.Table.from_pylist(rows, schema=RUN_SCHEMA)


@pytest.fixture
def results() -> pa.Table:
    rows = [
        result_row("run-c", "row-ok", 0.9, input="what is ok?", topic="billing",
                   verdicts=verdicts(["supported one"], ["lost sentence one"])),
        result_row("run-c", "row-low", 0.2, input=XSS, topic="tech",
                   verdicts=verdicts(["kept sentence"], ["the <b>missing</b> sentence"])),
        result_row("run-c", "row-err", None, input="boom?", error="JudgeResponseError: bad <json>"),
        result_row("run-c", "row-mid", 0.5, input="mid?", topic="billing"),
        result_row("run-c", "row-top", 1.0, input="top?", topic="tech", cached=True),
        result_row("run-c", "row-skip", None, input="skip?", skipped=True, reason="not judged: budget"),
        result_row("run-b", "row-of-other-run", 0.0, input="other run"),
    ]  # fmt: skip
    return pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)


@pytest.fixture
def comparisons() -> pa.Table:
    rows = [
        cmp_row("run-c", "run-a", "improved", mean_delta=0.2, compared_at=T0),  # older comparison
        cmp_row("run-c", "run-b", "regressed"),
        cmp_row("run-c", "run-b", "regressed", segment_column="topic", segment_value="billing", mean_delta=-0.25),
        cmp_row("run-b", "run-a", "unchanged"),
    ]
    return pa.Table.from_pylist(rows, schema=COMPARISON_SCHEMA)


def test_header_and_figures(runs: pa.Table, results: pa.Table) -> None:
    doc = render_report("run-c", runs, results)
    assert doc.startswith("<!DOCTYPE html>") and doc.rstrip().endswith("</html>")
    for text in ("run-c", "faq", "idx-run-c", "v2", "contextual_recall", "gpt-judge", "p3", "2024-05-03 06:00:00 UTC"):
        assert text in doc
    assert "0.650" in doc and "95 % CI [0.550, 0.750]" in doc
    assert "75.0%" in doc and "pass rate at threshold 0.5" in doc
    for value, key in ((6, "rows"), (4, "scored"), (1, "errors"), (1, "skipped"), (2, "cached")):
        assert f'<div class="v">{value}</div><div class="k">{key}</div>' in doc


def test_histogram_has_ten_bars(runs: pa.Table, results: pa.Table) -> None:
    doc = render_report("run-c", runs, results)
    assert doc.count('<rect class="bar"') == 10
    assert "[0.9, 1]: 2 rows" in doc and "[0.2, 0.3): 1 rows" in doc and "[0.5, 0.6): 1 rows" in doc
    assert "4 scored rows" in doc and "1 errored, 1 skipped" in doc


def test_histogram_scale(runs: pa.Table) -> None:
    five = pa.Table.from_pylist([run_row("r", 0, 2.5, scale=5.0)], schema=RUN_SCHEMA)
    res = pa.Table.from_pylist([result_row("r", "a", 5.0), result_row("r", "b", 0.0)], schema=RESULT_SCHEMA)
    doc = render_report("r", five, res)
    assert "[4.5, 5]: 1 rows" in doc and "[0, 0.5): 1 rows" in doc
    no_scale = five.drop_columns(["scale"])
    res3 = pa.Table.from_pylist([result_row("r", "a", 3.0)], schema=RESULT_SCHEMA)
    assert "[2.7, 3]: 1 rows" in render_report("r", no_scale, res3)


def test_trend_series_and_current(runs: pa.Table, results: pa.Table) -> None:
    doc = render_report("run-c", runs, results)
    assert doc.count('<circle class="point') == 3  # run-a, run-b, run-c: not the other dataset/metric or later run
    assert doc.count('<circle class="point current"') == 1
    current = re.search(r'<circle class="point current"[^>]*><title>([^<]*)</title>', doc)
    assert current is not None and current.group(1).startswith("run-c: mean 0.650")
    assert doc.count('<line class="whisker"') == 3 and '<polyline class="line"' in doc
    assert ">idx-run-a</text>" in doc and ">run-b</text>" in doc  # no label: short run id
    assert "run-x" not in doc and "run-y" not in doc and "run-future" not in doc
    assert doc.index(">idx-run-a</text>") < doc.index(">run-b</text>") < doc.index(">idx-run-c</text>")


def test_trend_short_run_id_label(results: pa.Table) -> None:
    rid = "20261130T171502Z-3f9a1c"
    runs = pa.Table.from_pylist([run_row(rid, 0, 0.5, label=None)], schema=RUN_SCHEMA)
    assert ">20261130…3f9a1c</text>" in render_report(rid, runs, results)


def test_trend_history_limit(runs: pa.Table, results: pa.Table) -> None:
    doc = render_report("run-c", runs, results, history=2)
    assert doc.count('<circle class="point') == 2 and "idx-run-a" not in doc


def test_single_run_has_no_line(results: pa.Table) -> None:
    one = pa.Table.from_pylist([run_row("run-c", 0, 0.6, ci_low=None, ci_high=math.nan)], schema=RUN_SCHEMA)
    doc = render_report("run-c", one, results)
    assert doc.count('<circle class="point current"') == 1
    assert "<polyline" not in doc and '<line class="whisker"' not in doc and "CI n/a" in doc


def test_verdict_badge(runs: pa.Table, results: pa.Table, comparisons: pa.Table) -> None:
    doc = render_report("run-c", runs, results, comparisons)
    assert re.search(r'<span class="badge" style="background:#c62828">REGRESSED</span>', doc)
    assert "IMPROVED" not in doc  # the latest overall comparison wins
    assert "vs baseline <code>run-b</code>" in doc
    assert "-0.100" in doc and "95 % CI [-0.180, -0.030]" in doc
    assert "pass→fail 3" in doc and "fail→pass 0" in doc and "p = 0.0123" in doc
    assert "regressed (-0.250)" in doc  # segment delta in the segment table
    assert "First run of its series" not in doc


def test_first_run_of_series(runs: pa.Table, results: pa.Table, comparisons: pa.Table) -> None:
    assert "First run of its series" in render_report("run-c", runs, results)
    assert "First run of its series" in render_report("run-a", runs, results, comparisons)
    segment_only = comparisons.filter(pa.compute.is_valid(comparisons.column("segment_column")))
    assert "First run of its series" in render_report("run-c", runs, results, segment_only)


def test_segments_table(runs: pa.Table, results: pa.Table) -> None:
    doc = render_report("run-c", runs, results)
    assert "<h2>Segments</h2>" in doc
    for text in ("<td>billing</td>", "<td>tech</td>", "<td>(null)</td>", "0.800", "75.0%"):
        assert text in doc
    assert doc.index("<td>billing</td>") < doc.index("<td>tech</td>") < doc.index("<td>(null)</td>")
    no_segments = runs.filter(pa.compute.is_null(runs.column("segment_column")))
    assert "<h2>Segments</h2>" not in render_report("run-c", no_segments, results)


def test_worst_rows_order_and_unsupported(runs: pa.Table, results: pa.Table) -> None:
    doc = render_report("run-c", runs, results)
    order = ["row-err", "row-low", "row-mid", "row-ok", "row-top", "row-skip"]
    positions = [doc.index(f"<code>{r}</code>") for r in order]
    assert positions == sorted(positions)
    assert "row-of-other-run" not in doc
    assert "the &lt;b&gt;missing&lt;/b&gt; sentence" in doc and "lost sentence one" in doc
    # every sentence with the judge's verdict: supported ones marked, unsupported ones flagged
    assert "✓ kept sentence" in doc and "✓ supported one" in doc
    assert "✗</span> the &lt;b&gt;missing&lt;/b&gt; sentence" in doc
    assert "JudgeResponseError: bad &lt;json&gt;" in doc and "not judged: budget" in doc
    assert "<th>question</th>" in doc and "what is ok?" in doc
    limited = render_report("run-c", runs, results, worst=2)
    assert "<code>row-low</code>" in limited and "<code>row-mid</code>" not in limited


def test_data_is_escaped(results: pa.Table) -> None:
    evil = pa.Table.from_pylist(
        [run_row("run-c", 0, 0.5, dataset=XSS, label="<img src=x onerror=alert(1)>", judge_model="a&b")],
        schema=RUN_SCHEMA,
    )
    res = results.append_column("x", pa.array([None] * results.num_rows, pa.string()))
    doc = render_report("run-c", evil, res)
    assert "<script" not in doc and "<img" not in doc
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in doc and "a&amp;b" in doc


def test_self_contained(runs: pa.Table, results: pa.Table, comparisons: pa.Table) -> None:
    doc = render_report("run-c", runs, results, comparisons)
    assert "http" not in doc and "<script" not in doc and "<link" not in doc and "@import" not in doc
    assert "<style>" in doc and doc.count("<svg") == 2


def _minimal_runs(run_id: str = "r", **kw: Any) -> pa.Table:
    return pa.Table.from_pylist([run_row(run_id, 0, kw.pop("mean", 0.5), **kw)], schema=RUN_SCHEMA)


@pytest.mark.parametrize(
    "case",
    ["empty results", "only errors", "missing columns", "nan ci", "one row", "run not in runs", "bare runs"],
)
def test_edge_cases_render(case: str) -> None:
    runs = _minimal_runs()
    res = pa.Table.from_pylist([], schema=RESULT_SCHEMA)
    if case == "only errors":
        runs = _minimal_runs(mean=None, scored=0, errors=2, ci_low=math.nan, ci_high=None, pass_rate=None)
        res = pa.Table.from_pylist([result_row("r", "e1", None, error="E1"), result_row("r", "e2", None, error="E2")],
                                   schema=RESULT_SCHEMA)  # fmt: skip
    elif case == "missing columns":
        res = pa.table({"run_id": ["r", "r"], "row_id": ["a", "b"], "score": [0.3, None]})
    elif case == "nan ci":
        runs = _minimal_runs(ci_low=math.nan, ci_high=math.inf, pass_rate=math.nan)
        res = pa.Table.from_pylist([result_row("r", "a", math.nan)], schema=RESULT_SCHEMA)
    elif case == "one row":
        res = pa.Table.from_pylist(
            [result_row("r", "a", 0.4, verdicts=verdicts([], ["only no"]))], schema=RESULT_SCHEMA
        )
    elif case == "run not in runs":
        runs = _minimal_runs("someone-else")
        res = pa.Table.from_pylist([result_row("r", "a", 0.4)], schema=RESULT_SCHEMA)
    elif case == "bare runs":
        runs = pa.table({"run_id": ["r"], "mean_score": [0.5]})
        res = pa.table({"row_id": ["a"]})
    doc = render_report("r", runs, res)
    assert doc.rstrip().endswith("</html>") and "<code>r</code>" in doc
    assert doc.count('<rect class="bar"') == 10
    assert "http" not in doc
    if case == "only errors":
        assert "<code>e1</code>" in doc and "E2" in doc and "0 scored rows" in doc and "CI n/a" in doc
        assert "No scored runs" in doc
    if case == "one row":
        assert "only no" in doc and doc.count('<circle class="point current"') == 1
    if case == "missing columns":
        assert "<th>question</th>" not in doc and "<code>a</code>" in doc
    if case == "empty results":
        assert "No result rows for this run" in doc


def _store(tmp_path: Any, runs: pa.Table, results: pa.Table, comparisons: pa.Table | None = None) -> ResultStore:
    from deltalake import write_deltalake

    write_deltalake(f"{tmp_path}/runs", runs)
    write_deltalake(f"{tmp_path}/results", results)
    if comparisons is not None:
        write_deltalake(f"{tmp_path}/comparisons", comparisons)
    return ResultStore(str(tmp_path), StorageConfig.from_options())


def test_write_report(tmp_path: Any, runs: pa.Table, results: pa.Table, comparisons: pa.Table) -> None:
    store = _store(tmp_path, runs, results, comparisons)
    uri = write_report(store, "run-c")
    path = tmp_path / "reports" / "run-c.html"
    assert path.exists() and uri.endswith("reports/run-c.html")
    doc = path.read_text(encoding="utf-8")
    assert "run-c" in doc and "row-low" in doc and "row-of-other-run" not in doc
    assert doc.count('<circle class="point') == 3
    assert "REGRESSED" in doc and "vs baseline <code>run-b</code>" in doc


def test_write_report_without_comparisons(tmp_path: Any, runs: pa.Table, results: pa.Table) -> None:
    store = _store(tmp_path, runs, results)
    write_report(store, "run-c")
    assert "First run of its series" in (tmp_path / "reports" / "run-c.html").read_text(encoding="utf-8")


def test_write_report_store_without_comparisons_support(tmp_path: Any, runs: pa.Table, results: pa.Table) -> None:
    store = _store(tmp_path, runs, results)
    original = store.read_table

    def read_table(name: str) -> Any:
        if name not in ("results", "runs"):
            raise ValueError(f"unknown table {name!r}")
        return original(name)  # type: ignore[arg-type]

    store.read_table = read_table  # type: ignore[method-assign]
    write_report(store, "run-c")
    assert "First run of its series" in (tmp_path / "reports" / "run-c.html").read_text(encoding="utf-8")


def test_write_report_unknown_run(tmp_path: Any, runs: pa.Table, results: pa.Table) -> None:
    store = _store(tmp_path, runs, results)
    with pytest.raises(ConfigError, match=r"run nope not found in .*runs"):
        write_report(store, "nope")
    empty = ResultStore(str(tmp_path / "empty"), StorageConfig.from_options())
    with pytest.raises(ConfigError, match="not found"):
        write_report(empty, "run-c")
    assert not (tmp_path / "reports" / "nope.html").exists()


def test_index_version_shown_only_when_it_is_not_the_label(results: pa.Table) -> None:
    """A run without --index-version records its label there: the header would say the label twice."""
    same = pa.Table.from_pylist([run_row("run-c", 0, 0.6, label="nightly", index_version="nightly")], schema=RUN_SCHEMA)
    meta = re.search(r'<p class="meta">(.*?)</p>', render_report("run-c", same, results)).group(1)
    assert "label <b>nightly</b>" in meta and "index version" not in meta
    other = pa.Table.from_pylist([run_row("run-c", 0, 0.6, label="nightly", index_version="2026-11-30")],
                                 schema=RUN_SCHEMA)  # fmt: skip
    assert "index version <b>2026-11-30</b>" in render_report("run-c", other, results)


def test_trend_axis_ends_at_the_scale(results: pa.Table) -> None:
    """Means near 1 with intervals reaching 1: no grid line above 1.0, a score no run can have."""
    near_one = pa.Table.from_pylist(
        [run_row(f"run-{i}", i, 0.95 + 0.01 * i, ci_high=1.0, ci_low=0.9) for i in range(4)], schema=RUN_SCHEMA
    )
    trend = render_report("run-3", near_one, results).split("<h2>Trend</h2>", 1)[1].split("</svg>", 1)[0]
    ticks = [float(v) for v in re.findall(r'<text class="tick"[^>]*>([\d.]+)</text>', trend)]  # round ticks (#43)
    assert len(ticks) >= 3 and max(ticks) == 1.0, ticks


def test_largest_drops_show_the_question_beside_the_id(runs: pa.Table, results: pa.Table) -> None:
    long = "How does the billing cycle work when " + "a plan changes mid-month and " * 10 + "<b>tags</b>?"
    drops = [
        {"row_id": "4e1f0c2a9b7d", "score_baseline": 1.0, "score_current": 0.5, "delta": -0.5, "lost": ["x."],
         "question": long},
        {"row_id": "no-question", "score_baseline": 1.0, "score_current": 0.5, "delta": -0.5, "lost": []},
    ]  # fmt: skip
    section = render_report("run-c", runs, results, drops=drops).split("Largest drops", 1)[1].split("</table>")[0]
    cell = re.search(r"<code>4e1f0c2a9b7d</code><br><span class=\"muted\">([^<]*)</span>", section)
    assert cell is not None and cell.group(1).startswith("How does the billing cycle work")
    assert cell.group(1).endswith("…") and len(cell.group(1)) == 160 and "<b>" not in section
    assert "<code>no-question</code></td>" in section


@pytest.mark.parametrize("with_row_id", [True, False])
def test_drops_get_their_question_back_from_the_dataset(tmp_path: Any, with_row_id: bool) -> None:
    """The results table has no question: it is read back by file and row, only while the row keeps its id."""
    import pyarrow.parquet as pq

    from recall_tasks.io.blocks import iter_row_ids
    from recall_tasks.io.datasets import open_dataset
    from recall_tasks.reports import run_data

    rows = [{"input": f"question {i}?", "expected_output": f"Answer {i}.", "retrieval_context": [f"c{i}"]}
            for i in range(4)]  # fmt: skip
    rows.append(dict(rows[0]))  # an exact duplicate: its id gets ~2
    if with_row_id:
        rows = [{"row_id": f"r{i}", **r} for i, r in enumerate(rows)]
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    ds = open_dataset(str(path), StorageConfig.from_options())
    ids = list(iter_row_ids(ds))
    assert len(set(ids)) == 5 and (with_row_id or ids[4] == f"{ids[0]}~2")
    results = pa.table({"row_id": ids, "source_file": [ds.files[0].uri] * 5, "source_row": [0, 1, 2, 3, 4]})
    drops = [{"row_id": ids[2]}, {"row_id": ids[4]}, {"row_id": "not-in-results"}]
    wanted = [str(d["row_id"]) for d in drops]
    for keep in (0, 50):  # the drops' rows read as wanted ones, or among the worst
        got = run_data.with_questions(None, {}, run_data.RunRows.of(results, keep, wanted), drops, ds)  # type: ignore[arg-type]
        assert [d.get("question") for d in got] == ["question 2?", "question 0?", None]
    moved = results.set_column(2, "source_row", pa.array([1, 0, 3, 2, 4]))  # rows rewritten since: ids differ
    moved_rows = run_data.RunRows.of(moved, 0, wanted)
    assert [d.get("question") for d in run_data.with_questions(None, {}, moved_rows, drops, ds)][:1] == [None]  # type: ignore[arg-type]
