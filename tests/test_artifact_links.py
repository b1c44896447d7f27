"""The output location in the Prefect artifacts stays a link (issue 58, item 5): an output URI comes from a flow-run
parameter or an event's payload, and was pasted unescaped into ``[HTML report](…)`` and the link artifacts.

Two committed runs (offline judge, no Prefect server) publish into an output whose name closes the link and adds
an ``<img onerror>``; every artifact's Markdown (a link artifact as Prefect formats it) is rendered with
markdown-it (CommonMark, raw HTML on) and checked.
"""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import unquote

import pytest
from markdown_it import MarkdownIt
from prefect.artifacts import LinkArtifact

from recall_tasks.pipeline import commit, publish, steps
from recall_tasks.pipeline.publish import Publication
from recall_tasks.pipeline.window import score_chunks
from recall_tasks.reports.markdown import md_url
from tests.test_pipeline import make_rows, write_parquet
from tests.test_tracking import degrade
from tests.test_window import PoolExecutor, plan_for

HOSTILE_DIR = "x) <img src=x onerror=alert(1)> ("
HOSTILE_LABEL = "v2) <img src=y onerror=alert(2)> [l](javascript:alert(3))"


def markdowns(publication: Publication) -> list[str]:
    """Every artifact's Markdown as the Prefect UI gets it (tables are no Markdown)."""
    out = []
    for a in publication.artifacts:
        if a.kind == "markdown":
            out.append(a.data)
        elif a.kind == "link":
            out.append(LinkArtifact(link=a.data, link_text=a.link_text).format())
    return out


def hrefs(markdown: str) -> list[str]:
    """The link targets markdown-it reads, as written (no scheme refused, no normalisation)."""
    md = MarkdownIt("commonmark", {"html": True}).enable("table")
    md.validateLink = lambda url: True
    md.normalizeLink = lambda url: url
    found = []
    for token in md.parse(markdown):
        for child in token.children or []:
            if child.type == "link_open":
                found.append(str(child.attrGet("href")))
    return found


def render(markdown: str) -> str:
    md = MarkdownIt("commonmark", {"html": True}).enable("table")
    md.validateLink = lambda url: True  # file:// links rendered too: what a permissive viewer shows
    return md.render(markdown)


def publish_two_runs(tmp_path: Path) -> tuple[Path, list[Publication]]:
    rows = make_rows(12)
    out = tmp_path / HOSTILE_DIR
    publications = []
    for i, (data, label) in enumerate(((rows, "v1"), (degrade(rows, 2), HOSTILE_LABEL))):
        path = write_parquet(tmp_path / f"v{i}" / "eval.parquet", data)
        plan = plan_for(path, out, label=label, segment_by=["category"], dataset_name="eval")
        row = commit.commit_run(plan, score_chunks(plan, PoolExecutor(plan)).parts)
        _, publication = publish.publish_run(plan, row, logging.getLogger("test-artifact-links"))
        steps.finish_run(plan)
        publications.append(publication)
    return out, publications


def test_an_output_location_that_closes_the_link_adds_no_html_to_any_artifact(tmp_path: Path) -> None:
    out, publications = publish_two_runs(tmp_path)
    assert any(a.kind == "markdown" and a.key.startswith("recall-regression") for a in publications[1].artifacts)
    for publication in publications:
        texts = markdowns(publication)
        assert len(texts) == 3 + (publication is publications[1])  # results, report, HTML link (+ regression)
        for text in texts:
            assert "<img" not in text, text
            html = render(text)
            assert "<img" not in html, html
            for href in hrefs(text):  # one target each, balanced: nothing of the output's name left outside
                assert not set(href) & set(" ()<>\"'`\n"), href
                assert unquote(href).removeprefix("file://").startswith(str(out)), href
        links = [h for text in texts for h in hrefs(text)]
        report = [unquote(h) for h in links if h.endswith(".html")]  # the report's link and the link artifact
        assert len(report) == 2 and report[0] == report[1] and report[0].startswith(f"file://{out}/reports/")
        assert [unquote(h) for h in links if h.endswith("/results")] == [f"{out}/results"]


@pytest.mark.parametrize(
    "uri",
    [
        "s3://bucket/recall/reports/r.html",
        "gs://b/x/r.html",
        "file:///tmp/out/reports/r.html",
        "http://127.0.0.1:9000/b/r.html?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F20240101%2Fus"
        "-east-1&X-Amz-Expires=3600&X-Amz-Signature=0a1b",
    ],
)
def test_a_working_link_keeps_its_target(uri: str) -> None:
    assert md_url(uri) == uri
    assert hrefs(f"[r]({md_url(uri)})") == [uri]


def test_nothing_in_a_link_target_ends_it_or_adds_markup() -> None:
    uri = 's3://b/a b(c)<d>"e"`f`\n\\g\'h\x00i\u2028j/é'
    target = md_url(uri)
    assert not set(target) & set(" ()<>\"'`\n\\\x00\u2028é"), target
    assert unquote(target) == uri
    assert hrefs(f"[r]({target}) after") == [target]
