"""A regressed ``run`` prints the segments and rows that lost most (as ``demo --regression`` does); the progress
shown during a run starts at 0 of the known total and moves with the rows, not in 500-row chunk steps."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from recall_tasks.cli import app as cli
from recall_tasks.cli.demo_regression import degraded_contexts
from recall_tasks.config import RunParams
from recall_tasks.pipeline import progress
from recall_tasks.pipeline.local_run import run_in_process
from tests import judge_script
from tests.test_pipeline import make_rows, write_parquet

SAMPLE = [
    json.loads(line)
    for line in resources.files("recall_tasks").joinpath("data", "sample.jsonl").read_text("utf-8").splitlines()
    if line
]


def test_a_regressed_run_prints_the_segments_and_rows_that_lost_most(prefect_harness, tmp_path: Path) -> None:
    data = tmp_path / "data" / "sample.parquet"
    data.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(SAMPLE), data)
    retrieval = tmp_path / "data" / "v2.parquet"
    pq.write_table(degraded_contexts(SAMPLE), retrieval)
    out = str(tmp_path / "out")
    common = [str(data), "-o", out, "--on-missing", "skip", "--segment-by", "category"]
    first = CliRunner().invoke(cli.app, ["run", *common, "--label", "v1"], env={"COLUMNS": "200"})
    assert first.exit_code == 0, first.output
    assert "lost most" not in first.output  # no baseline: nothing lost
    second = CliRunner().invoke(
        cli.app, ["run", *common, "--label", "v2", "--retrieval-uri", str(retrieval)], env={"COLUMNS": "200"}
    )
    assert second.exit_code == 0, second.output
    assert ": regressed (" in second.output
    segments = second.output.split("Segments that lost most:", 1)[1]
    assert re.search(r"│ category\s+│ geography\s+│ too_few_rows\s+│ -0\.5\s+│ 3\s+│ 2\s+│", segments), segments
    rows = second.output.split("Rows that lost most (the HTML report lists the sentences each lost):", 1)[1]
    assert re.search(r"┃ row_id\s+┃ baseline\s+┃ current\s+┃ delta\s+┃", rows), rows
    assert re.search(r"│ moon-1\s+│ 0\.6667\s+│ 0\.0\s+│ -0\.6667\s+│", rows), rows
    assert "5 of 11 shown; all: recall-bench query" in rows
    gated = CliRunner().invoke(
        cli.app,
        [
            "run",
            *common,
            "--label",
            "v2",
            "--retrieval-uri",
            str(retrieval),
            "--fail-on-regression",
            "--baseline",
            "label:v1",
        ],
        env={"COLUMNS": "200"},
    )
    assert gated.exit_code == 3, gated.output
    assert "Rows that lost most" in gated.output and "moon-1" in gated.output


def test_progress_starts_at_the_known_total_and_moves_with_the_rows(tmp_path: Path) -> None:
    data = write_parquet(tmp_path / "d.parquet", make_rows(1200))
    shown: list[tuple[int, int | None]] = []
    bar = progress.RowProgress()

    class Watch:
        def progress(self, done: int, total: int) -> None:
            shown.append((bar.chunks(done, total), bar.total))

        def rows(self, seq: int, n: int | None) -> None:
            shown.append((bar.rows(seq, n), bar.total))

        def aborted(self, rows_cached: int) -> None:
            raise AssertionError("not aborted")

        def waiting(self, message: str) -> None:
            raise AssertionError(f"not waiting: {message}")

        def note(self, message: str) -> None:
            raise AssertionError(f"no note: {message}")

    run_in_process(
        RunParams(dataset_uri=data, output_uri=str(tmp_path / "out"), judge="lexical", chunk_size=500), Watch()
    )
    assert shown[0] == (0, 1200)  # 0 of the known total before any row settles (was: nothing until 500)
    values = [v for v, _ in shown]
    assert values == sorted(values) and values[-1] == 1200
    assert len({v for v in values if v % 500}) > 100, values  # between the chunk steps: it moves with the rows


def test_the_cli_bar_knows_the_total_before_the_rows_move_it(
    prefect_harness, fake_openai, tmp_path: Path, monkeypatch
) -> None:
    """`recall-bench run` through Prefect: the bar has the run's total from its first update on, and every row
    moves it as it settles (a terminal once showed 33/?, 64/?, ... 287/? for the first second of a 3,000-row run
    against the fake judge, rows judged before the total was known)."""
    import rich.progress

    fake_openai.set_responder(judge_script.responder)
    data = write_parquet(tmp_path / "d.parquet", make_rows(900))
    updates: list[tuple[float, float | None]] = []

    class Recording(rich.progress.Progress):
        def update(self, task_id: rich.progress.TaskID, **kwargs: Any) -> None:
            super().update(task_id, **kwargs)
            task = self._tasks[task_id]
            updates.append((task.completed, task.total))

    monkeypatch.setattr(rich.progress, "Progress", Recording)
    done = CliRunner().invoke(
        cli.app,
        [
            "run",
            str(data),
            "-o",
            str(tmp_path / "out"),
            "--judge",
            "openai",
            "--base-url",
            fake_openai.base_url,
            "--chunk-size",
            "300",
        ],
        env={"OPENAI_API_KEY": "sk-test", "COLUMNS": "200"},
    )
    assert done.exit_code == 0, done.output
    assert updates and updates[-1] == (900, 900), updates
    assert updates[0][1] == 900, updates[:5]  # the total from the first update on (was: None, the bar's 0/?)
    assert all(total == 900 for _, total in updates), [u for u in updates if u[1] != 900][:5]
    steps = [b - a for (a, _), (b, _) in zip(updates, updates[1:], strict=False)]
    # every row moves it as it settles, those judged before the bar was drawn too (they were lost, and the bar
    # then jumped by them when their chunk settled: and a settle must not count a chunk twice)
    assert max(steps) <= 50, [u for u, s in zip(updates[1:], steps, strict=True) if s > 50]


def test_rows_settled_before_the_bar_is_drawn_still_count() -> None:
    """Rows that settle before the bar is drawn are counted: they were dropped, and the bar jumped by them when
    their chunk settled (a 3,000-row run: 332 -> 1175)."""
    from recall_tasks.cli.run_flow import _Watch

    watch = _Watch()
    watch.progress(0, 3000)
    for _ in range(120):
        watch.rows(0, 1)  # no bar yet
    drawn: list[tuple[int, int | None]] = []
    watch.bar = lambda: drawn.append((watch.shown.shown, watch.shown.total))
    watch.rows(1, 1)
    watch.rows(0, None)  # chunk 0 settles: its count is forgotten, then the settled total has its rows
    watch.progress(500, 3000)
    assert drawn == [(121, 3000), (121, 3000), (501, 3000)]


def test_a_chunk_scored_long_before_it_settles_keeps_its_rows_counted() -> None:
    """A head start's chunk is scored while Prefect starts and settles only when the flow reaches it: its count is
    kept until then, and the next chunk's rows move the bar on (it stood still, then jumped by 500)."""
    bar = progress.RowProgress()
    bar.total = 1000
    shown: list[int] = []

    class Watch:
        def rows(self, seq: int, n: int | None) -> None:
            shown.append(bar.rows(seq, n))

    for seq, n in ((0, 500), (1, 100)):
        with progress.counting_rows(seq, Watch()):
            tell = progress.rows_settled.get()
            assert tell is not None
            for _ in range(n):
                tell(1)
    assert shown[-1] == 600 and shown == sorted(shown)
    Watch().rows(0, None)  # chunk 0 settles (window.score_chunks): forgotten here, counted in done next
    assert bar.chunks(500, 1000) == 600
