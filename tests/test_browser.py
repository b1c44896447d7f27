"""In a real browser: the HTML report renders without console errors and every chart has its marks (the trend's
y-axis on round ticks), and the local Prefect server's printed UI address shows the run's flow run and artifacts.

The browser is the system's headless Chromium (Debian's ``chromium``, installed by ``.ci/run``), driven by
Playwright (``executable_path``: Playwright's own browser download is never used). A missing browser fails.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from recall_tasks.reports.html_sections import round_ticks
from tests.prefect_server import seed_database
from tests.test_server import Local

SAMPLE = [
    json.loads(line)
    for line in resources.files("recall_tasks").joinpath("data", "sample.jsonl").read_text("utf-8").splitlines()
    if line
]


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "headless Chromium is needed: apt-get install chromium (Debian's package; .ci/run installs it)"
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # --no-sandbox: Chromium refuses to start its sandbox as root (CI containers)
        launched = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


class Page:
    """A page and every console error and uncaught exception it had, and its requests that failed or got an error
    status (what a timed-out wait reports: :meth:`wait_for_text`)."""

    def __init__(self, browser: Any) -> None:
        self.page = browser.new_page()
        self.errors: list[str] = []
        self.failed: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("requestfailed", lambda r: self.failed.append(f"{r.method} {r.url}: {r.failure}"))
        self.page.on("response", lambda r: self.failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)

    def wait_for_text(self, text: str, timeout_ms: int = 60_000) -> None:
        """Wait until ``text`` is visible; a timeout fails naming what the page showed, logged and asked."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        try:
            self.page.get_by_text(text).first.wait_for(timeout=timeout_ms)
        except PlaywrightTimeout:
            shown = self.page.locator("body").inner_text(timeout=5_000)[:2_000]
            pytest.fail(
                f"{text!r} not visible in {timeout_ms / 1000:g} s at {self.page.url}; matches in the page: "
                f"{self.page.get_by_text(text).count()}\nconsole errors: {self.errors}\nfailed requests: "
                f"{self.failed}\npage text:\n{shown}"
            )


@pytest.fixture
def view(browser: Any) -> Iterator[Page]:
    """A page in a context of its own, closed after the test. Left open, every repeat's Prefect UI page kept
    rendering in the module's one browser: with 7-8 of them Chromium's GPU process (software compositing) used
    ~0.8 of a core, the UI test slowed from 24 to 93 s over 10 repeats, and under ``make test-flaky`` its wait for
    the flow run's logs timed out in 4 of 20. Closed: 18-36 s over 10 repeats, two renderers throughout."""
    opened = Page(browser)
    try:
        yield opened
    finally:
        opened.page.close()  # a page from browser.new_page closes its context with it
    assert browser.contexts == [], f"a test left {len(browser.contexts)} browser contexts open"


def test_round_ticks() -> None:
    assert round_ticks(0.0, 0.875) == (0.0, 1.0, [0.0, 0.25, 0.5, 0.75, 1.0])
    assert round_ticks(0.62, 0.71) == (0.6, 0.75, [0.6, 0.65, 0.7, 0.75])


@pytest.mark.concurrency
def test_the_html_report_renders_with_every_chart_marked(view: Page, tmp_path: Path) -> None:
    from recall_tasks import evaluate

    out = tmp_path / "recall-output"
    evaluate(SAMPLE, output=out, on_missing="skip", segment_by=["category"], label="v1")
    fewer = [{**row, "retrieval_context": row["retrieval_context"][1:] or row["retrieval_context"]} for row in SAMPLE]
    second = evaluate(fewer, output=out, on_missing="skip", segment_by=["category"], label="v2")
    report = Path(second.summary["report_uri"])
    view.page.goto(report.as_uri())
    assert view.page.title()
    charts = view.page.locator("svg.chart")
    assert charts.count() == 2  # the score distribution and the trend
    histogram, trend = charts.nth(0), charts.nth(1)
    heights = [
        float(h or 0) for h in histogram.locator("rect.bar").evaluate_all("bs => bs.map(b => b.getAttribute('height'))")
    ]
    assert len(heights) > 0 and sum(h > 0 for h in heights) >= 2, heights
    assert trend.locator("circle.point").count() == 2 and trend.locator("line.whisker").count() == 2
    assert trend.locator("polyline.line").count() == 1
    for chart in (histogram, trend):  # drawn with a size, inside the page
        box = chart.bounding_box()
        assert box is not None and box["width"] > 100 and box["height"] > 100
    labels = trend.locator("text.tick").all_text_contents()  # SVG text has no innerText
    assert len(labels) >= 3 and all(re.fullmatch(r"-?\d+(\.\d{1,2})?", t) for t in labels), labels
    ticks = [float(t) for t in labels]
    step = ticks[1] - ticks[0]
    assert all(abs(t / step - round(t / step)) < 1e-9 for t in ticks), ticks  # round multiples of one step
    assert view.errors == []


@pytest.mark.concurrency
def test_the_printed_ui_address_shows_the_run_and_its_artifacts(view: Page, tmp_path: Path) -> None:
    local = Local(tmp_path)
    try:
        seed_database(local.state / "prefect" / "prefect.db")
        run = local.cli("demo", "--output", str(local.root / "out"))
        assert run.returncode == 0, run.stdout + run.stderr
        (ui,) = set(re.findall(r"UI (http://127\.0\.0\.1:\d+)", run.stderr))  # the address the run printed
        asked: list[str] = []
        view.page.on("request", lambda r: asked.append(r.url))
        view.page.goto(f"{ui}/runs", wait_until="networkidle")
        view.page.get_by_text("recall-sample.parquet-demo").first.click()  # the run's flow run, listed
        view.page.wait_for_url(re.compile(r".*/runs/flow-run/[0-9a-f-]+"), timeout=60_000)
        view.wait_for_text("Finished in state Completed()")  # its logs
        view.page.get_by_text("Artifacts", exact=True).first.click()
        for key in (
            "recall-results",
            "recall-summary-sample-contextual-recall",
            "recall-html-sample-contextual-recall",
        ):
            view.wait_for_text(key)
        assert "Oops" not in view.page.content()
        api = [u for u in asked if "/api/" in u]
        assert api and all(u.startswith(f"{ui}/api/") for u in api), sorted(
            set(api) - {u for u in api if u.startswith(ui)}
        )
    finally:
        local.kill()
