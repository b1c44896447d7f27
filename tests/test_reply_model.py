"""The model that replied, per row: a gateway that falls back to another model no longer passes for the one asked.

``results.reply_model`` records what each reply's ``model`` field named (Delta, Iceberg, Parquet; older tables read
it as null and ``maintain`` keeps it); a reply from another model than the one asked for (a dated snapshot of it,
``gpt-4o-mini-2024-07-18``, is the same model) is flagged on its row, never cached, counted in
``runs.substituted_rows``, and a comparison whose runs were answered by different models is ``incomparable``.
The fake OpenAI server's ``reply_model`` names another model, as a gateway's fallback does.
"""

from __future__ import annotations

import re

import pyarrow.parquet as pq
import pytest

from recall_tasks.analysis.comparability import replied_reason
from recall_tasks.config import RunParams
from recall_tasks.io.results import ResultStore
from recall_tasks.io.storage import StorageConfig
from recall_tasks.judges.base import other_model
from recall_tasks.pipeline.flow import recall_benchmark
from tests import judge_script
from tests.fake_openai import extract_user_text
from tests.test_pipeline import KEY, make_rows, write_parquet

SNAPSHOT = "gpt-4o-mini-2024-07-18"
FALLBACK = "llama-3-8b-instruct"
FELL_BACK = ("r0003", "r0011", "r0012")


@pytest.fixture
def judge_env(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    return fake_openai


def gateway(fallback_rows: tuple[str, ...]):
    """Replies name the dated snapshot, except for the questions of ``fallback_rows``: another model answered."""
    questions = {f"What about item {int(r[1:])}?" for r in fallback_rows}

    def reply_model(body: dict) -> str:
        text = extract_user_text(body, roles=("user",))
        return FALLBACK if any(f'"{q}"' in text for q in questions) else SNAPSHOT

    return reply_model


def run(judge, data: str, out: str, fmt: str = "delta", **kw):
    return recall_benchmark(RunParams(dataset_uri=data, output_uri=out, judge="openai", base_url=judge.base_url,
                                      format=fmt, chunk_size=10, **kw))  # fmt: skip


def rows_of(out: str, fmt: str = "delta") -> list[dict]:
    store = ResultStore(out, StorageConfig.from_options(), fmt)
    return store.read_table("results").to_table().to_pylist()


def test_other_model_is_not_a_dated_snapshot():
    assert not other_model("gpt-4o-mini", "gpt-4o-mini-2024-07-18")
    assert not other_model("gpt-4", "gpt-4-0613") and not other_model("gpt-4o-mini", None)
    assert not other_model("gpt-4o-mini-2024-07-18", "gpt-4o-mini")
    assert other_model("gpt-4o-mini", "llama-3-8b-instruct") and other_model("gpt-4o-mini", "gpt-4o")


def test_a_fallback_reply_is_recorded_flagged_counted_and_not_cached(prefect_harness, judge_env, tmp_path):
    """Today results, cost and the row cache all said gpt-4o-mini for the llama replies; a rerun served them."""
    data = write_parquet(tmp_path / "eval.parquet", make_rows(20, seed=31))
    out = str(tmp_path / "out")
    judge_env.reply_model = gateway(FELL_BACK)
    first = run(judge_env, data, out)
    assert first["substituted_rows"] == 3 and first["reply_models"] == [SNAPSHOT, FALLBACK]
    by_id = {r["row_id"]: r for r in rows_of(out)}
    for row_id, row in by_id.items():
        assert row["judge_model"] == "gpt-4o-mini"
        if row_id in FELL_BACK:
            assert row["reply_model"] == FALLBACK
            assert f"replied by model {FALLBACK}, not gpt-4o-mini as asked (not cached)" in row["flags"]
        else:
            assert row["reply_model"] == SNAPSHOT and not any(f.startswith("replied by") for f in row["flags"])

    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    judge_env.reply_model = SNAPSHOT  # the gateway is healthy again
    second = run(judge_env, data, out, baseline=None)
    assert len(judge_env.chat_requests) == 3  # only the fallback rows were not cached: judged again
    assert second["substituted_rows"] == 0 and second["reply_models"] == [SNAPSHOT]
    latest = {r["row_id"]: r for r in rows_of(out) if r["run_id"] == second["run_id"]}
    assert {r["reply_model"] for r in latest.values()} == {SNAPSHOT}
    assert sum(r["cached"] for r in latest.values()) == 17


def test_a_comparison_judged_by_other_models_is_incomparable(prefect_harness, judge_env, tmp_path):
    data = write_parquet(tmp_path / "eval.parquet", make_rows(20, seed=37))
    out = str(tmp_path / "out")
    judge_env.reply_model = SNAPSHOT
    run(judge_env, data, out, cache=False)
    judge_env.reply_model = gateway(FELL_BACK)
    fell_back = run(judge_env, data, out, cache=False, baseline="latest")
    comparison = fell_back["comparison"]
    assert comparison["verdict"] == "incomparable", comparison
    assert re.search(
        r"the models that replied differ \(current \['gpt-4o-mini', 'llama-3-8b-instruct'\], baseline "
        r"\['gpt-4o-mini'\]\): what judged the rows changed",
        comparison["reason"],
    ), comparison["reason"]
    judge_env.reply_model = "gpt-4o-mini-2024-11-20"  # a newer snapshot of the same model: still comparable
    first_again = run(judge_env, data, out, cache=False, baseline=fell_back["comparison"]["baseline_run_id"])
    assert first_again["comparison"]["verdict"] != "incomparable", first_again["comparison"]


def test_replied_reason_on_runs_recorded_before_the_columns():
    old = {"judge_model": "gpt-4o-mini"}  # reply_models and substituted_rows: null
    assert replied_reason({"reply_models": [SNAPSHOT], "substituted_rows": 0}, old) is None
    assert replied_reason(
        {"reply_models": [SNAPSHOT, FALLBACK], "substituted_rows": 2, "judge_model": "gpt-4o-mini"}, old
    ) == (  # fmt: skip
        "2 rows of this run were judged by another model than 'gpt-4o-mini' (replies from "
        "['gpt-4o-mini-2024-07-18', 'llama-3-8b-instruct']); the baseline does not record which models replied"
    )


def without_reply_model(store: ResultStore, fmt: str) -> None:
    """Turn the output's results table into one written before ``results.reply_model`` existed."""
    if fmt == "delta":
        from deltalake import DeltaTable, write_deltalake

        old = DeltaTable(store.results_uri).to_pyarrow_table().drop_columns(["reply_model"])
        write_deltalake(store.results_uri, old, mode="overwrite", schema_mode="overwrite",
                        partition_by=["dataset", "run_date"])  # fmt: skip
    elif fmt == "iceberg":
        old = store.iceberg.table("results").scan().to_arrow().drop_columns(["reply_model"])
        store.iceberg.catalog.drop_table(store.iceberg.identifier("results"))
        run_id = old.column("run_id")[0].as_py()
        store.iceberg.append("results", lambda: old, f"old-{run_id}", ["dataset", "run_date"], ("run_id", run_id))
    else:
        for path in store.fs.find(store.path("results")):
            table = pq.read_table(path, filesystem=store.fs).drop_columns(["reply_model"])
            pq.write_table(table, path, filesystem=store.fs)
        return
    assert "reply_model" not in store.read_table("results").schema.names


@pytest.mark.parametrize("fmt", ["delta", "iceberg", "parquet"])
def test_older_tables_take_the_column_and_read_null_and_maintain_keeps_it(prefect_harness, judge_env, tmp_path, fmt):
    from recall_tasks.io.maintenance import maintain

    data = write_parquet(tmp_path / "eval.parquet", make_rows(8, seed=41))
    out = str(tmp_path / "out")
    judge_env.reply_model = SNAPSHOT
    old = run(judge_env, data, out, fmt, cache=False, baseline=None)
    store = ResultStore(out, StorageConfig.from_options(), fmt)
    without_reply_model(store, fmt)
    judge_env.reply_model = gateway(("r0002",))
    new = run(judge_env, data, out, fmt, cache=False, baseline=None)
    if fmt != "parquet":
        maintain(store, 0, allow_short_retention=True)  # compaction rewrites the files: the column stays
    got = {(r["run_id"], r["row_id"]): r["reply_model"] for r in rows_of(out, fmt)}
    assert len(got) == 16
    assert all(got[(old["run_id"], f"r{i:04d}")] is None for i in range(8))  # written before the column
    assert got[(new["run_id"], "r0002")] == FALLBACK
    assert all(got[(new["run_id"], f"r{i:04d}")] == SNAPSHOT for i in range(8) if i != 2)
    runs = ResultStore(out, StorageConfig.from_options(), fmt).read_table("runs").to_table().to_pylist()
    assert {r["run_id"]: r["substituted_rows"] for r in runs if r["segment_column"] is None} == {
        old["run_id"]: 0, new["run_id"]: 1}  # fmt: skip


def test_the_fake_names_another_model_only_when_told(judge_env):
    import openai

    client = openai.OpenAI(base_url=judge_env.base_url, api_key=KEY)
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    assert client.chat.completions.create(**body).model == "gpt-4o-mini"
    judge_env.reply_model = FALLBACK
    assert client.chat.completions.create(**body).model == FALLBACK
    client.close()


def test_a_run_whose_replies_came_from_another_model_says_so_once_and_in_its_summary(
    prefect_harness, judge_env, tmp_path
):
    """Every reply from llama-3-8b-instruct for gpt-4o-mini: recorded and counted, but the run printed nothing and its
    summary read ``judge_model gpt-4o-mini``."""
    from typer.testing import CliRunner

    from recall_tasks.cli.app import app

    data = write_parquet(tmp_path / "eval.parquet", make_rows(12, seed=32))
    judge_env.reply_model = FALLBACK
    done = CliRunner().invoke(
        app, ["run", data, "-o", str(tmp_path / "out"), "--judge", "openai", "--base-url", judge_env.base_url],
        env={"COLUMNS": "250"},
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    warnings = [line for line in done.output.splitlines() if FALLBACK in line and line.startswith("warning:")]
    assert warnings == [
        f"warning: 12 row(s) were judged by {FALLBACK}, not gpt-4o-mini: the replies named another model (a "
        "gateway's fallback); their verdicts are not cached and results.reply_model names the model of each row"
    ], done.output
    assert re.search(rf"│ judge_model\s+│ gpt-4o-mini \(asked; 12 rows answered by {FALLBACK}\)\s+│", done.output), (
        done.output
    )
