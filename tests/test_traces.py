"""Retrieval context from agent traces: ``--context-from tool-results[:NAME,...]`` and ``--context-extractor``."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from recall_tasks import ConfigError, DatasetError
from recall_tasks.config import RunParams
from recall_tasks.io.blocks import iter_blocks
from recall_tasks.io.datasets import open_dataset
from recall_tasks.io.storage import StorageConfig
from recall_tasks.io.traces import TraceContext, parse_messages, render_result, tool_results
from recall_tasks.pipeline import steps
from tests import judge_script
from tests.test_pipeline import KEY

_CALL = pa.struct([("id", pa.string()), ("type", pa.string()),
                   ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])  # fmt: skip
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_call_id", pa.string()),
                     ("name", pa.string()), ("tool_calls", pa.list_(_CALL))])  # fmt: skip
PARIS_RESULT = {"title": "Paris", "text": "Paris is the capital of France"}


def call(cid: str, name: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}


def trace(question: str, results: list[tuple[str, str]]) -> list[dict]:
    """A user turn, then per (tool, content) an assistant tool call and its result, then the answer."""
    msgs: list[dict] = [{"role": "user", "content": question}]
    for k, (tool, content) in enumerate(results):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [call(f"c{k}", tool)]})
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": content})
    msgs.append({"role": "assistant", "content": "Done."})
    return msgs


ROWS = [
    {"row_id": "paris", "input": "What is the capital of France?", "expected_output": "Paris is the capital of France.",
     "messages": trace("capital?", [("search", json.dumps(PARIS_RESULT)), ("calculator", "42")]),
     "retrieval_context": ["static context is ignored for agent rows"]},
    {"row_id": "einstein", "input": "Einstein?",
     "expected_output": "Einstein was born in 1879. Einstein developed relativity.",
     "messages": trace("who?", [("search", "Einstein was born in Ulm in 1879"),
                                ("wiki", "relativity was developed by Einstein")]),
     "retrieval_context": None},
    {"row_id": "security", "input": "Security?", "expected_output": "Security measures include encryption.",
     "messages": None, "retrieval_context": ["Security measures include encryption and audits"]},
]  # fmt: skip


def write(path, json_strings: bool = False) -> str:
    rows = [dict(r) for r in ROWS]
    schema = pa.schema([("row_id", pa.string()), ("input", pa.string()), ("expected_output", pa.string()),
                        ("messages", pa.string() if json_strings else pa.list_(MESSAGE)),
                        ("retrieval_context", pa.list_(pa.string()))])  # fmt: skip
    if json_strings:
        for r in rows:
            r["messages"] = None if r["messages"] is None else json.dumps(r["messages"])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return str(path)


# -- pure functions ------------------------------------------------------------------------------------------


def test_tool_results_one_chunk_per_result_filtered_by_the_calls_tool_name() -> None:
    msgs = ROWS[0]["messages"]
    assert tool_results(msgs) == ['{"title":"Paris","text":"Paris is the capital of France"}', "42"]
    assert tool_results(msgs, frozenset({"calculator"})) == ["42"]
    named = [{"role": "tool", "name": "search", "content": [{"type": "text", "text": "parts"}]}]
    assert tool_results(named, frozenset({"search"})) == ["parts"]  # no tool_calls: the result's own name
    assert render_result({"a": [1, 2]}) == '{"a":[1,2]}' and render_result("  {not json ") == "{not json"
    assert render_result(None) == "" and tool_results([{"role": "tool", "content": " "}]) == []


def test_parse_messages() -> None:
    assert parse_messages(None) is None and parse_messages("") is None and parse_messages("[]") is None
    assert parse_messages('[{"role": "user"}]') == [{"role": "user"}]
    for bad, why in (("{oops", "not valid JSON"), ('{"role": "user"}', "must be a list"), ("[1]", "not a message")):
        with pytest.raises(ValueError, match=why):
            parse_messages(bad)


def _blocks(path: str, spec: TraceContext | None = None, **kw):
    ds = open_dataset(path, StorageConfig(), traces=True, **kw)
    trace_ctx = spec or TraceContext.from_options("tool-results", None, ds.columns["messages"])
    return [trace_ctx.apply(b) for b in iter_blocks(ds, 10)]


def test_context_extractor_function_and_the_static_context_of_other_rows(tmp_path) -> None:
    path = write(tmp_path / "d.parquet")
    for fn in ("final_answer_sources", "async_sources"):
        ctx = TraceContext.from_options(None, f"tests.sample_traces:{fn}", "messages")
        (block,) = _blocks(path, ctx)
        contexts = block.table.column("retrieval_context").to_pylist()
        assert contexts == [["Done."], ["Done."], ["Security measures include encryption and audits"]]
        assert "messages" not in block.table.column_names  # the trace is not copied to the results


def test_renamed_messages_column_and_its_errors(tmp_path) -> None:
    path = tmp_path / "d.parquet"
    table = pa.table({"expected_output": ["A b."], "trace": ['[{"role": "tool", "content": "a b"}]']})
    pq.write_table(table, path)
    (block,) = _blocks(str(path), overrides={"messages": "trace"})
    assert block.table.column("retrieval_context").to_pylist() == [["a b"]]
    with pytest.raises(DatasetError, match="no messages column"):
        open_dataset(str(path), StorageConfig(), traces=True)
    pq.write_table(pa.table({"expected_output": ["A."], "messages": [1]}), path)
    with pytest.raises(DatasetError, match="expected list<struct>"):
        open_dataset(str(path), StorageConfig(), traces=True)
    pq.write_table(pa.table({"expected_output": ["A.", "B."], "messages": [None, "{oops"]}), path)
    with pytest.raises(DatasetError, match=r"not valid JSON.*row 1.*column 'messages'"):
        _blocks(str(path))


@pytest.mark.parametrize(
    ("fn", "error", "message"),
    [
        ("crashes", DatasetError, r"failed: KeyError: 'documents' \(file .*d.parquet, row 0, column 'messages'\)"),
        ("wrong_type", DatasetError, r"must return a list of strings, got str \(file .*row 0"),
        ("one_argument", ConfigError, "must take \\(input, messages\\)"),
        ("NOT_CALLABLE", ConfigError, "has no callable 'NOT_CALLABLE'"),
        ("missing", ConfigError, "has no callable 'missing'"),
    ],
)
def test_a_bad_context_extractor_is_a_clear_error(tmp_path, fn, error, message) -> None:
    path = write(tmp_path / "d.parquet")
    with pytest.raises(error, match=message):
        _blocks(path, TraceContext.from_options(None, f"tests.sample_traces:{fn}", "messages"))


def test_cli_bad_context_extractor_is_one_error_line(tmp_path) -> None:
    from typer.testing import CliRunner

    from recall_tasks.cli.app import app

    path = write(tmp_path / "d.parquet")
    args = ["run", path, "-o", str(tmp_path / "o"), "--context-extractor", "tests.sample_traces:crashes"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "KeyError" in result.output and "row 0" in result.output


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"context_from": "tool-results", "context_extractor": "tests.sample_traces:crashes"}, "give one"),
        ({"context_from": "tool-results", "retriever": "tests.sample_retriever:retrieve"}, "give one"),
        ({"columns": {"messages": "messages"}}, "needs --context-from"),
    ],
)
def test_conflicting_context_sources_are_refused(tmp_path, kw, message) -> None:
    path = write(tmp_path / "d.parquet")
    with pytest.raises(ConfigError, match=message):
        steps.check_run(RunParams(dataset_uri=path, output_uri=str(tmp_path / "o"), **kw))


def test_context_from_is_validated() -> None:
    RunParams(dataset_uri="d", context_from="tool-results:search,wiki")
    with pytest.raises(ValueError, match="context_from"):
        RunParams(dataset_uri="d", context_from="messages")


# -- the pipeline ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("json_strings", "context_from", "scores"),
    [
        (False, "tool-results", {"paris": 1.0, "einstein": 1.0, "security": 1.0}),
        (True, "tool-results:search", {"paris": 1.0, "einstein": 0.5, "security": 1.0}),
    ],
)
def test_agent_rows_scored_from_their_tool_results(
    prefect_harness, fake_openai, monkeypatch, tmp_path, json_strings, context_from, scores
) -> None:
    from recall_tasks.pipeline.flow import recall_benchmark

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    data = tmp_path / "data" / "agent.parquet"
    data.parent.mkdir()
    write(data, json_strings)
    out = tmp_path / "out"
    summary = recall_benchmark(
        RunParams(
            dataset_uri=str(data),
            output_uri=str(out),
            judge="openai",
            base_url=fake_openai.base_url,
            context_from=context_from,
        )  # fmt: skip
    )
    assert summary["errors"] == 0 and len(fake_openai.chat_requests) == 3
    results = {r["row_id"]: r for r in DeltaTable(str(out / "results")).to_pyarrow_table().to_pylist()}
    assert {k: r["score"] for k, r in results.items()} == scores
    evidence = {}
    for r in fake_openai.chat_requests:
        _, statements, chunks = judge_script.parse_prompt(r["body"])
        evidence[statements[0]] = chunks
    paris = ['{"title":"Paris","text":"Paris is the capital of France"}']
    assert evidence["Paris is the capital of France."] == (paris + ["42"] if context_from == "tool-results" else paris)
    assert evidence["Security measures include encryption."] == ["Security measures include encryption and audits"]
    assert "messages" not in DeltaTable(str(out / "results")).to_pyarrow_table().column_names
