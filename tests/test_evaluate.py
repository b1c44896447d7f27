"""``recall_tasks.evaluate``/``a_evaluate``: docs/library.md's example as written, every kind of input, inside a
running event loop (as in Jupyter), the tables kept in an output, and the Prefect flow's results for the same data."""

from __future__ import annotations

import asyncio
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recall_tasks import ConfigError, Evaluation, a_evaluate, evaluate
from recall_tasks.io.schemas import RESULT_FIELDS, RUN_FIELDS

DOC = Path(__file__).resolve().parents[1] / "docs" / "library.md"
SAMPLE = [
    json.loads(line)
    for line in resources.files("recall_tasks").joinpath("data", "sample.jsonl").read_text("utf-8").splitlines()
    if line
]


def doc_example() -> str:
    section = DOC.read_text().split("\n## A whole dataset: `evaluate()`\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1
    return blocks[0]


def test_the_doc_example_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    namespace: dict[str, Any] = {}
    exec(compile(doc_example(), str(DOC), "exec"), namespace)  # its own assertions hold
    assert capsys.readouterr().out == "completed 2 0.833\n"
    result = namespace["result"]
    assert isinstance(result, Evaluation) and result.output is None
    assert result.run["segment_column"] is None  # .run is the overall row of runs


def scores(result: Evaluation) -> dict[str, float | None]:
    table = result.results
    return dict(zip(table.column("row_id").to_pylist(), table.column("score").to_pylist(), strict=True))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Evaluation:
    path = tmp_path_factory.mktemp("jsonl") / "sample.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in SAMPLE))
    return evaluate(path, on_missing="skip")


def test_a_path_gives_the_results_schema_and_the_runs_row(reference: Evaluation) -> None:
    assert reference.results.num_rows == len(SAMPLE)
    names = reference.results.schema.names
    assert names[: len(RESULT_FIELDS)] == [f.name for f in RESULT_FIELDS]
    assert set(reference.results.column("run_id").to_pylist()) == {reference.run["run_id"]}
    assert list(reference.run) == [f.name for f in RUN_FIELDS]
    assert reference.run["status"] == "completed" and reference.run["rows"] == len(SAMPLE)
    assert reference.run["flow_run_id"] is None  # in process: no flow run
    assert "report_uri" not in reference.summary  # its temporary folder is gone


@pytest.mark.parametrize("kind", ["table", "pandas", "dicts"])
def test_every_in_memory_input_scores_as_the_file_does(reference: Evaluation, kind: str) -> None:
    import pandas as pd

    data: Any = {
        "table": pa.Table.from_pylist(SAMPLE),
        "pandas": pd.DataFrame(SAMPLE),
        "dicts": SAMPLE,
    }[kind]
    result = evaluate(data, on_missing="skip")
    assert scores(result) == scores(reference)
    assert result.run["dataset"] == "in-memory"
    frame = result.to_pandas()
    assert isinstance(frame, pd.DataFrame) and len(frame) == len(SAMPLE)


def test_column_mapping_as_a_dict_or_as_run_s_flags() -> None:
    renamed = [{("prompt" if k == "input" else k): v for k, v in row.items()} for row in SAMPLE]
    by_dict = evaluate(renamed, columns={"input": "prompt"}, on_missing="skip")
    by_flags = evaluate(renamed, columns=["input=prompt"], on_missing="skip")
    assert by_dict.results.column("input").to_pylist() == [row["input"] for row in SAMPLE]
    assert scores(by_dict) == scores(by_flags)


def test_inside_a_running_event_loop_sync_and_async(tmp_path: Path) -> None:
    """A notebook cell runs while the kernel's loop runs: the sync call works there, the async one is awaited,
    and two awaited at once both finish."""

    async def cell() -> tuple[Evaluation, Evaluation, Evaluation]:
        asyncio.get_running_loop()  # what Jupyter has
        sync = evaluate(SAMPLE, on_missing="skip")
        first, second = await asyncio.gather(
            a_evaluate(SAMPLE, on_missing="skip", output=tmp_path / "a"),
            a_evaluate(SAMPLE, on_missing="skip", output=tmp_path / "b"),
        )
        return sync, first, second

    sync, first, second = asyncio.run(cell())
    assert scores(sync) == scores(first) == scores(second)
    assert first.output == str(tmp_path / "a") and second.output == str(tmp_path / "b")


def test_an_output_keeps_the_tables_and_a_rerun_is_cached_and_compared(tmp_path: Path) -> None:
    out = tmp_path / "recall-output"
    first = evaluate(SAMPLE, output=out, on_missing="skip", label="v1")
    assert first.comparison is None and first.summary["no_baseline"]
    assert Path(first.summary["report_uri"]).exists()
    second = evaluate(SAMPLE, output=str(out), on_missing="skip", label="v2")
    assert second.run["cached"] == second.run["scored"] > 0  # the row cache served every judged row
    assert second.comparison is not None and second.comparison["baseline_run_id"] == first.run["run_id"]
    assert second.comparison["verdict"] == "unchanged"


def test_refusals_are_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="a path, a pyarrow Table, a pandas DataFrame or a list of dicts"):
        evaluate({"input": "q"})
    with pytest.raises(ConfigError, match="prefect=True"):
        evaluate(SAMPLE, on_missing="skip", task_runner="processes")
    with pytest.raises(ValueError, match="no_such_option"):
        evaluate(SAMPLE, no_such_option=1)


def test_the_prefect_flow_and_the_in_process_run_write_the_same_results(
    prefect_harness: None, tmp_path: Path, reference: Evaluation
) -> None:
    data = tmp_path / "data" / "sample.parquet"
    data.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(SAMPLE), data)
    flow = evaluate(data, prefect=True, on_missing="skip", output=tmp_path / "flow-output")
    local = evaluate(data, on_missing="skip", output=tmp_path / "local-output")
    assert flow.run["flow_run_id"] and local.run["flow_run_id"] is None
    assert scores(flow) == scores(local) == scores(reference)
    drop = {"run_id", "latency_ms", "run_date"}
    assert flow.results.schema == local.results.schema
    same = [n for n in flow.results.schema.names if n not in drop]
    assert flow.results.select(same).sort_by("row_id").equals(local.results.select(same).sort_by("row_id"))


def test_cancelling_the_awaiting_task_stops_the_judge_calls(fake_openai: Any, monkeypatch: Any, tmp_path: Path) -> None:
    """A notebook's interrupt (the cell's task cancelled): the judge calls in flight are cancelled at once, the
    run's thread ends, nothing is committed."""
    import time

    from tests import judge_script
    from tests.test_pipeline import KEY

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    fake_openai.latency_s = 5.0  # every reply takes 5 s: the run is still judging when it is cancelled
    out = tmp_path / "out"

    async def cell() -> float:
        task = asyncio.ensure_future(
            a_evaluate(SAMPLE, output=out, on_missing="skip", judge="openai", base_url=fake_openai.base_url)
        )
        while not fake_openai.chat_requests:  # the first judge request has arrived
            await asyncio.sleep(0.01)
        cancelled_at = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - cancelled_at

    took = asyncio.run(cell())
    assert took < 4.0, took  # not after the 5 s replies
    assert not (out / "runs").exists()  # nothing committed


def test_cancelling_one_of_two_runs_leaves_the_other_to_finish(
    fake_openai: Any, monkeypatch: Any, tmp_path: Path
) -> None:
    """Two ``a_evaluate()`` runs in one event loop, a judge at 300 ms: cancelling one cancels its own calls only
    (each run has its own cancel scope); the other scores every row. Before, the cancel reached every run of the
    process (``cancel_all_scopes``) and the other failed too."""
    from tests import judge_script
    from tests.test_pipeline import KEY, expected, make_rows

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    fake_openai.latency_s = 0.3
    kept_rows, cancelled_rows = make_rows(40, seed=31), make_rows(40, seed=32)
    options = {"judge": "openai", "base_url": fake_openai.base_url, "chunk_size": 10, "max_concurrency": 4}

    async def two_runs() -> Evaluation:
        kept = asyncio.ensure_future(a_evaluate(kept_rows, output=tmp_path / "kept", **options))
        cancelled = asyncio.ensure_future(a_evaluate(cancelled_rows, output=tmp_path / "cancelled", **options))
        while len(fake_openai.chat_requests) < 8:  # both are judging
            await asyncio.sleep(0.01)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        return await kept

    result = asyncio.run(two_runs())
    assert result.run["status"] == "completed" and result.run["rows"] == 40 and result.run["errors"] == 0
    got = scores(result)
    assert got == {r["row_id"]: pytest.approx(expected(r)) for r in kept_rows}
    assert not (tmp_path / "cancelled" / "runs").exists()  # the cancelled one committed nothing


def test_evaluate_leaves_the_hosts_environment_and_collector_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A library call sets nothing in its host: no environment variable, the collector's thresholds as the host
    set them, while the run judges and after it. Before, a run raised them to (20000, 10, 100) while it judged."""
    import gc
    import os

    from recall_tasks.pipeline import conduct

    mine = (701, 11, 12)
    before_env = dict(os.environ)
    before = gc.get_threshold()
    seen: list[tuple[int, ...]] = []
    real = conduct.score_chunks

    def watched(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.get_threshold())
        return real(*args, **kwargs)

    monkeypatch.setattr(conduct, "score_chunks", watched)
    gc.set_threshold(*mine)
    try:
        result = evaluate(SAMPLE, output=tmp_path / "out", on_missing="skip")
        after = gc.get_threshold()
    finally:
        gc.set_threshold(*before)
    assert result.run["status"] == "completed"
    assert seen == [mine] and after == mine
    assert dict(os.environ) == before_env
