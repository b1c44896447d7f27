"""Dataset text in the Markdown artifacts stays text: no HTML, no images, links, headings or extra table rows.

The markdown is rendered the way a permissive viewer would (markdown-it: CommonMark, GFM tables, raw HTML on)
and the HTML is checked, so a test fails if any value becomes markup.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from markdown_it import MarkdownIt

from recall_tasks.analysis.regression import compare_runs
from recall_tasks.config import RunParams
from recall_tasks.pipeline.artifacts import artifact_key
from recall_tasks.pipeline.flow import recall_benchmark
from recall_tasks.reports.comparison import comparison_markdown
from recall_tasks.reports.markdown import md_code, md_text
from tests import judge_script
from tests.test_pipeline import KEY
from tests.test_regression import results, run_row

HOSTILE = (
    "Evil <script>alert(1)</script> here. See ![x](http://attacker.test/beacon.png) now. "
    "# Heading | a | b |\n\n| c | d |. Click [me](javascript:alert(1)) and <img src=x onerror=alert(1)> too."
)
ROW_IDS = ["r`1", "r``2|x", "r3\n| injected | row |", "<b>r4</b>", "r5 ", "r6"]


def render(markdown: str) -> str:
    return MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown)


def assert_inert(markdown: str, html: str, links: int = 0) -> None:
    """No HTML, image or heading from the data; ``links``: the artifact's own links (the HTML report's)."""
    assert "<script" not in markdown and "![" not in markdown and "<img" not in markdown
    for tag in ("<script", "<img", "<b>", "<h4", "<h5", "<h6"):
        assert tag not in html, (tag, html)
    anchors = re.findall(r"<a [^>]*>(.*?)</a>", html)
    assert len(anchors) <= links and all(a == "HTML report" for a in anchors), html


def codes(html: str) -> list[str]:
    import html as html_lib

    return [html_lib.unescape(c) for c in re.findall(r"<code>(.*?)</code>", html)]


@pytest.mark.parametrize(
    "value",
    ["<script>x</script>", "![a](http://b/c.png)", "[l](http://x)", "# h", "a | b", "a\nb\r\nc", "x`y``z", "*b* _i_"],
)
def test_md_text_and_md_code_keep_values_literal(value):
    flat = re.sub(r"[\r\n]+", " ", value)
    html = render(f"| a |\n|---|\n| {md_text(value)} |\n| {md_code(value, table=True)} |")
    assert html.count("<tr>") == 3 and html.count("<td>") == 2  # header + two rows, one cell each
    assert "<script" not in html and "<img" not in html and "<a " not in html and "<em>" not in html
    assert codes(html) == [flat]
    text = re.sub(r"<[^>]+>", "", html.split("<tbody>")[1].split("</tr>")[0])
    import html as html_lib

    assert html_lib.unescape(text).strip() == flat


def test_run_report_artifact_escapes_dataset_text(prefect_harness, fake_openai, monkeypatch, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    n = len(ROW_IDS)
    data = pa.table(
        {
            "row_id": ROW_IDS,
            "question": ["q"] * n,
            "ground_truth": [HOSTILE] * n,
            "contexts": [["nothing relevant"]] * n,
        }
    )
    path = tmp_path / "eval.parquet"
    pq.write_table(data, path)
    summary = recall_benchmark(
        RunParams(
            dataset_uri=str(path), output_uri=str(tmp_path / "out"), judge="openai", base_url=fake_openai.base_url,
            model="gpt-4o-mini <img src=x onerror=alert(2)>",
        )
    )  # fmt: skip
    assert summary["scored"] == n
    with get_client(sync_client=True) as client:
        key = artifact_key("report", "eval", "contextual_recall")
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    report = next(a.data for a in arts if summary["run_id"] in a.data)
    html = render(report)
    assert_inert(report, html, links=1)  # the report's own link (markdown-it drops it for a file:// URL)
    assert html.count("<h1>") == 1 and html.count("<h2>") == 1  # the report's own headings only
    assert html.count("<tr>") == 1 + n  # header + one per row: no row or cell injected
    assert all(row.count("<td>") == 3 for row in html.split("<tr>")[2:])
    assert sorted(c for c in codes(html) if c.startswith(("r", "<b>"))) == sorted(r.replace("\n", " ") for r in ROW_IDS)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown as text, not dropped


def test_regression_markdown_escapes_row_ids_statements_and_segments():
    ids = ROW_IDS * 5
    n = len(ids)
    ids = [f"{r}#{i}" for i, r in enumerate(ids)]
    lost = [{"statement": HOSTILE, "verdict": "no", "reason": "", "chunk_ids": []}]
    kept = [{"statement": HOSTILE, "verdict": "yes", "reason": "", "chunk_ids": [1]}]
    segment = ["<script>s</script>", "a|b\n| x |", "![i](http://t/p.png)"] * 10
    base = results("base <b>", ids, [1.0] * n, verdicts=[kept] * n, segment=segment)
    cur = results("cur `x`", ids, [0.0] * n, verdicts=[lost] * n, segment=segment)
    cmp = compare_runs(
        cur, base, current_run=run_row("cur `x`", dataset="faq<script>"), baseline_run=run_row("base <b>"),
        segment_columns=["segment"], worst=5,
    )  # fmt: skip
    markdown = comparison_markdown(cmp)
    html = render(markdown)
    assert_inert(markdown, html)
    assert html.count("<h1>") == 0 and html.count("<h2>") == 1 and html.count("<h3>") == 2  # its own headings
    segment_table = html.split("<table>")[2]
    assert segment_table.count("<tr>") == 1 + 3  # header + one per segment value
    assert "cur `x`" in codes(html) and "base <b>" in codes(html)
    drops = [c for c in codes(html) if "#" in c]
    assert len(drops) == 5 and all(d in [i.replace("\n", " ") for i in ids] for d in drops)
