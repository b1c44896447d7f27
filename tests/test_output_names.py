"""Output folders whose names a table writer cannot take (issue 58 item 8): a run either commits there and reads back,
or is refused before any judge call (one ``error:`` line, exit 2, naming the output and the character, a name
suggested). What deltalake 1.6 does with a table location, found by writing to such folders (docs in
``recall_tasks/io/delta.py``): locally, ``[ ] ^ |`` make it panic at the commit, ``\\`` is read as ``/``, a ``%``
escape (``%20``) is decoded (the table would go to ``recall v2``); on S3 the key is handed to it percent-encoded, so
``? # [ ] ^ |`` work there, escapes and ``\\`` do not. Parquet takes every name; Iceberg's embedded catalog did not
take ``%20`` or ``?`` (its SQLite URL) nor a ``file://`` output with ``?`` (its table location, a URL).

Real components: the CLI in process, the fake OpenAI server (its request log: nothing is sent before a refusal),
Prefect, SeaweedFS for the S3 case.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from recall_tasks.cli.app import app
from tests import judge_script
from tests import s3_server as _s3
from tests.test_calibrate import labelled_rows
from tests.test_pipeline import KEY, make_rows

s3_server = _s3.s3_server
s3_bucket = _s3.s3_bucket

ROWS = 6


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


@pytest.fixture
def judge(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    return fake_openai


@pytest.fixture
def dataset(tmp_path, judge) -> list[str]:
    """A dataset of ``ROWS`` rows and the options of a run judged by the fake OpenAI server."""
    path = tmp_path / "data" / "eval.parquet"
    path.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(make_rows(ROWS, seed=58)), path)
    return [str(path), "--judge", "openai", "--base-url", judge.base_url]


def refused(result: Any, out: str, *said: str) -> str:
    """Exit 2 and one ``error:`` line naming ``out`` and each of ``said``; no traceback, no other line."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and all(line.startswith(("error:", "judge:")) for line in lines), result.output
    printed = out.replace("\t", "\\t")  # a control character is shown escaped: the error stays one line
    assert errors[0].startswith(f"error: --output {printed}: "), errors[0]
    for text in said:
        assert text in errors[0], errors[0]
    assert "Traceback" not in result.output
    return errors[0]


def read_back(out: str, rows: int = ROWS, runs: int = 1) -> None:
    """``history`` lists ``runs`` runs of ``rows`` rows and ``query`` counts their rows in ``results``."""
    history = cli("history", "-o", out, "--output-format", "json")
    assert history.exit_code == 0, history.output
    listed = [json.loads(line) for line in history.stdout.splitlines()]
    assert [r["rows"] for r in listed] == [rows] * runs
    counted = cli("query", "SELECT count(*) AS n FROM results", "-o", out, "--output-format", "json")
    assert counted.exit_code == 0, counted.output
    assert json.loads(counted.stdout) == {"n": rows * runs}


@pytest.mark.parametrize("name", ["recall [v2]", "recall%20v2"])
def test_an_output_named_recall_v2_commits_or_is_refused_before_any_judge_call(
    prefect_harness, tmp_path, dataset, judge, name
):
    for fmt in ("parquet", "iceberg"):  # both take the name: committed, read back, nothing written beside it
        out = str(tmp_path / fmt / name)
        sent = len(judge.chat_requests)
        ran = cli("run", *dataset, "-o", out, "--format", fmt)
        assert ran.exit_code == 0, (fmt, ran.output)
        assert len(judge.chat_requests) - sent == ROWS
        read_back(out)
        assert os.listdir(tmp_path / fmt) == [name]

    out = str(tmp_path / "delta" / name)  # deltalake cannot: refused, a run and a dry run alike
    sent = len(judge.requests)
    said = {"recall [v2]": "'[' and ']' (deltalake fails on them", "recall%20v2": "'%20' (deltalake decodes it to ' '"}
    for extra in ([], ["--dry-run"]):
        error = refused(cli("run", *dataset, "-o", out, *extra), out, said[name])
    assert len(judge.requests) == sent  # no judge call, not even the endpoint's probe
    assert not (tmp_path / "delta").exists()  # no results file, chunk, cache or lease anywhere
    suggested = str(tmp_path / "delta" / "recall_v2")
    assert f"rename it, e.g. --output {suggested}" in error and "or choose --format parquet or iceberg" in error
    ran = cli("run", *dataset, "-o", suggested)  # the name suggested works
    assert ran.exit_code == 0, ran.output
    read_back(suggested)


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("a|b", "'|' (deltalake fails on it"),
        ("a^b", "'^' (deltalake fails on it"),
        ("a\\b", "'\\' (deltalake takes it for '/')"),
        ("a%2Fb", "'%2F' (deltalake decodes it to '/'"),
        ("a\tb", "'\\t' (deltalake refuses control characters)"),
    ],
)
def test_every_name_deltalake_cannot_take_is_refused_before_any_judge_call(
    prefect_harness, tmp_path, dataset, judge, name, said
):
    out = str(tmp_path / "out" / name)
    error = refused(cli("run", *dataset, "-o", out), out, said)
    assert f"e.g. --output {tmp_path / 'out' / 'a_b'}, " in error
    assert judge.requests == [] and not (tmp_path / "out").exists()


def test_calibrate_refuses_a_delta_output_it_could_not_commit_before_judging(tmp_path, judge):
    labels = tmp_path / "labels.jsonl"
    labels.write_text("".join(json.dumps(r) + "\n" for r in labelled_rows()), encoding="utf-8")
    out = str(tmp_path / "out" / "calib [v2]")
    got = cli("calibrate", str(labels), "--model", "gpt-4o-mini", "--base-url", judge.base_url, "-o", out)
    refused(got, out, "'[' and ']' (deltalake fails on them")
    assert judge.requests == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_file_url_output_with_a_question_mark_or_hash_keeps_its_tables_inside(prefect_harness, tmp_path, dataset,
                                                                                fmt):  # fmt: skip
    """``file://`` is a path like the others: its ``?`` and ``#`` are part of the folder's name (the old code handed
    deltalake and pyiceberg the URL: the tables went to ``<tmp>/o``, the catalog's database too)."""
    folder = tmp_path / "o?v2#1"
    out = f"file://{folder}"
    ran = cli("run", *dataset, "-o", out, "--format", fmt)
    assert ran.exit_code == 0, ran.output
    read_back(out)
    assert sorted(os.listdir(tmp_path)) == ["data", folder.name]
    assert (folder / "results").is_dir() and (folder / "runs").is_dir()


def test_iceberg_outputs_x_y_and_x_percent_20_y_keep_their_own_catalogs(prefect_harness, tmp_path, dataset):
    """The embedded catalog's SQLite URL decoded ``%20``: the second output's tables were registered in the first
    one's catalog (its history then listed both runs)."""
    for name in ("x y", "x%20y"):
        ran = cli("run", *dataset, "-o", str(tmp_path / name), "--format", "iceberg")
        assert ran.exit_code == 0, ran.output
    for name in ("x y", "x%20y"):
        read_back(str(tmp_path / name))
        assert (tmp_path / name / "_iceberg_catalog.db").is_file()


def test_delta_on_s3_takes_brackets_question_marks_and_hashes(
    prefect_harness, s3_server, s3_bucket, tmp_path, dataset, monkeypatch
):
    """On S3 the old code let deltalake cut the key at ``?`` or ``#`` (the tables of ``night?v2`` went to ``night``,
    shared with any other output cut the same way) and panic on ``[``: the key is now handed to it encoded."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    prefix = "night [v2]?a#b|c^d"
    out = f"s3://{s3_bucket}/{prefix}"
    ran = cli("run", *dataset, "-o", out)
    assert ran.exit_code == 0, ran.output
    read_back(out)
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert keys and all(k.startswith(prefix + "/") for k in keys), sorted({k.split("/")[0] for k in keys})
    assert any(k.startswith(f"{prefix}/results/_delta_log/") for k in keys)


def test_delta_on_s3_refuses_a_key_with_an_escape_before_any_judge_call(
    prefect_harness, s3_server, s3_bucket, dataset, judge, monkeypatch
):
    """deltalake decodes ``%20`` in a key (twice: encoded as ``%2520`` it still ends as a space): the old code wrote
    ``night%20v2``'s tables to ``night v2``, after the judging."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    out = f"s3://{s3_bucket}/night%20v2"
    refused(cli("run", *dataset, "-o", out), out, "'%20' (deltalake decodes it to ' '")
    assert judge.requests == []
    assert s3_server.client().list_objects_v2(Bucket=s3_bucket).get("Contents", []) == []


def test_the_suggested_name_replaces_each_run_of_refused_characters(tmp_path: Path):
    from recall_tasks.io.delta import location_problem

    assert location_problem(str(tmp_path / "fine name?#é")) is None
    assert location_problem("s3://b/k [v2]?#") is None
    cases = {
        "/d/recall [v2]": "/d/recall_v2",
        "/d/[a]/b%20c|d": "/d/a/b_c_d",
        "/d/a\\b": "/d/a_b",
        "s3://b/n%41m": "s3://b/n_m",
        "s3://b/x\\y": "s3://b/x_y",
    }
    for uri, suggestion in cases.items():
        problem = location_problem(uri)
        assert problem is not None and problem.suggestion == suggestion, (uri, problem)
