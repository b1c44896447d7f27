"""A catalogue of bad inputs, each run through the real flow (or the CLI where it is a CLI concern).

For every refused input: one clear error naming the file (URI), the column and/or row, and expected vs found
type; nothing written under the output (no ``results``/``runs`` table, no Parquet file); and, for dataset
errors, no request reached the judge (the OpenAI judge points at the fake server).
For every handled input: the documented handling (``on_missing`` policy, counted in the run summary), with
the judge asked only about the rows that can be judged.

Cases are data: add one by appending an entry to the lists below. Every test runs with the working directory
set to its tmp dir, so a URI that resolves to "the current directory" can never touch the repository.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from prefect.exceptions import ParameterTypeError
from pydantic import ValidationError

from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError, DatasetError, RunFailed, StorageError
from recall_tasks.io.results import ResultStore
from recall_tasks.io.storage import StorageConfig
from recall_tasks.pipeline.flow import recall_benchmark
from tests import judge_script
from tests import s3_server as _s3
from tests.fake_openai import FakeOpenAI

KEY = "sk-badinputs-SECRET-0123456789abcdef"
CLI_SECRET = "cliSECRETvalue-9f8e7d6c5b4a"
CTX = pa.list_(pa.string())


# ------------------------------------------------------------------------------------------------ helpers


def rows(n: int = 4) -> list[dict[str, Any]]:
    """Rows the scripted judge scores 1.0 (every word of the answer is in the first chunk)."""
    words = ["alpha bravo", "charlie delta", "echo foxtrot", "golf hotel", "india juliet", "kilo lima"]
    return [
        {
            "row_id": f"r{i}",
            "question": f"What about item {i}?",
            "ground_truth": f"{words[i % 6].capitalize()} matter.",
            "contexts": [f"{words[i % 6]} matter here", "unrelated filler"],
            "category": "ab"[i % 2],
        }
        for i in range(n)
    ]


def table(data: list[dict[str, Any]], **types: pa.DataType) -> pa.Table:
    """A table from rows; ``types`` pins column types (``contexts`` defaults to list<string>)."""
    names = list(data[0]) if data else ["row_id", "question", "ground_truth", "contexts", "category"]
    types = {"contexts": CTX, **types}
    arrays = {n: pa.array([r.get(n) for r in data], types.get(n)) for n in names}
    return pa.table(arrays)


def write(path: Path, data: pa.Table | list[dict[str, Any]], **types: pa.DataType) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(data if isinstance(data, pa.Table) else table(data, **types), path)
    return str(path)


def drop(data: list[dict[str, Any]], column: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != column} for r in data]


def assign(data: list[dict[str, Any]], column: str, values: list[Any]) -> list[dict[str, Any]]:
    return [{**r, column: v} for r, v in zip(data, values, strict=True)]


@dataclass
class Ctx:
    """What a case builder gets: a tmp dir, the output URI, the fake judge, S3 when the case asks for it."""

    tmp: Path
    out: str
    fake: FakeOpenAI
    monkeypatch: pytest.MonkeyPatch
    s3: _s3.S3Server | None = None
    bucket: str | None = None

    @property
    def data(self) -> Path:
        return self.tmp / "data" / "eval.parquet"

    def s3_env(self, **overrides: str) -> None:
        assert self.s3 is not None
        for k, v in {**self.s3.env(), **overrides}.items():
            self.monkeypatch.setenv(k, v)

    def upload(self, local: str, key: str) -> str:
        assert self.s3 is not None and self.bucket is not None
        self.s3.client().upload_file(local, self.bucket, key)
        return f"s3://{self.bucket}/{key}"


def nothing_written(ctx: Ctx) -> None:
    """No results/runs table, no Parquet file, no run marker under the output (local dir or S3 prefix)."""
    if ctx.out.startswith("s3://"):
        assert ctx.s3 is not None and ctx.bucket is not None
        listing = ctx.s3.client().list_objects_v2(Bucket=ctx.bucket, Prefix="out/")
        keys = [o["Key"] for o in listing.get("Contents", [])]
        assert keys == [], keys
        return
    out = Path(ctx.out or ctx.tmp / "out")
    assert not (out / "results").exists() and not (out / "runs").exists()
    files = [str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert files == [], files
    # nothing leaked into the working directory either (an empty URI once meant "the current directory")
    assert not (ctx.tmp / "results").exists() and not (ctx.tmp / "runs").exists()


@pytest.fixture
def ctx(prefect_harness, fake_openai, monkeypatch, tmp_path) -> Ctx:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    fake_openai.set_responder(judge_script.responder)
    # flow-run heartbeats are off for every in-process run of the session (the prefect_harness fixture)
    return Ctx(tmp=tmp_path, out=str(tmp_path / "out"), fake=fake_openai, monkeypatch=monkeypatch)


def with_s3(ctx: Ctx, request: pytest.FixtureRequest) -> None:
    """Start (once per session) and attach the SeaweedFS server and a fresh bucket; output goes there."""
    ctx.s3 = request.getfixturevalue("s3_server")
    ctx.bucket = request.getfixturevalue("s3_bucket")
    ctx.out = f"s3://{ctx.bucket}/out"


def run_flow(ctx: Ctx, **kw: Any) -> dict[str, Any]:
    kw.setdefault("output_uri", ctx.out)
    kw.setdefault("judge", "openai")
    kw.setdefault("base_url", ctx.fake.base_url)
    kw.setdefault("chunk_size", 3)
    kw.setdefault("max_retries", 0)
    return recall_benchmark(RunParams(**kw))


# ------------------------------------------------------------------------------- refused: through the flow


@dataclass
class Refused:
    """A bad input the flow must refuse before judging or writing anything."""

    id: str
    make: Callable[[Ctx], dict[str, Any]]  # -> RunParams keyword arguments (dataset_uri at least)
    error: type[Exception]
    needles: list[str]  # substrings of the message; "{uri}" is the dataset URI, "{tmp}" the tmp dir
    s3: bool = False
    absent: list[str] = field(default_factory=list)  # substrings that must NOT appear (secrets)
    xfail: str | None = None

    def param(self) -> Any:
        marks = [pytest.mark.xfail(strict=True, reason=self.xfail)] if self.xfail else []
        return pytest.param(self, id=self.id, marks=marks)


def _data(ctx: Ctx, data: pa.Table | list[dict[str, Any]], **types: pa.DataType) -> dict[str, Any]:
    return {"dataset_uri": write(ctx.data, data, **types)}


def _folder_with_two(ctx: Ctx, second: pa.Table | list[dict[str, Any]]) -> dict[str, Any]:
    folder = ctx.tmp / "data" / "parts"
    write(folder / "part-0.parquet", rows(3))
    write(folder / "part-1.parquet", second)
    return {"dataset_uri": str(folder)}


def _truncated(ctx: Ctx) -> dict[str, Any]:
    uri = write(ctx.data, rows(50))
    blob = ctx.data.read_bytes()
    ctx.data.write_bytes(blob[: len(blob) // 2])
    return {"dataset_uri": uri}


def _random_bytes(ctx: Ctx) -> dict[str, Any]:
    ctx.data.parent.mkdir(parents=True)
    ctx.data.write_bytes(os.urandom(4096))
    return {"dataset_uri": str(ctx.data)}


def _zero_row_folder(ctx: Ctx) -> dict[str, Any]:
    folder = ctx.tmp / "data" / "empty-parts"
    write(folder / "part-0.parquet", table(rows()).slice(0, 0))
    write(folder / "part-1.parquet", table(rows()).slice(0, 0))
    return {"dataset_uri": str(folder)}


def _empty_folder(ctx: Ctx) -> dict[str, Any]:
    (ctx.tmp / "data" / "empty").mkdir(parents=True)
    return {"dataset_uri": str(ctx.tmp / "data" / "empty")}


def _folder_without_parquet(ctx: Ctx) -> dict[str, Any]:
    folder = ctx.tmp / "data" / "csv"
    folder.mkdir(parents=True)
    (folder / "eval.csv").write_text("question,ground_truth\nq,a\n")
    write(folder / "_tmp.parquet", rows(2))  # hidden: names starting with _ are ignored
    return {"dataset_uri": str(folder)}


def _s3_missing_object(ctx: Ctx) -> dict[str, Any]:
    ctx.s3_env()
    return {"dataset_uri": f"s3://{ctx.bucket}/datasets/nope.parquet"}


def _s3_missing_bucket(ctx: Ctx) -> dict[str, Any]:
    ctx.s3_env()
    return {"dataset_uri": "s3://rb-no-such-bucket-7f3a/datasets/eval.parquet"}


def _s3_wrong_credentials(ctx: Ctx) -> dict[str, Any]:
    ctx.s3_env()
    uri = ctx.upload(write(ctx.data, rows()), "datasets/eval.parquet")
    ctx.s3_env(AWS_SECRET_ACCESS_KEY=CLI_SECRET)
    return {"dataset_uri": uri}


def _s3_corrupted(ctx: Ctx) -> dict[str, Any]:
    ctx.s3_env()
    ctx.data.parent.mkdir(parents=True)
    ctx.data.write_bytes(b"PAR1 definitely not parquet PAR1")
    return {"dataset_uri": ctx.upload(str(ctx.data), "datasets/eval.parquet")}


def _s3_glob_no_match(ctx: Ctx) -> dict[str, Any]:
    ctx.s3_env()
    ctx.upload(write(ctx.data, rows()), "datasets/eval.parquet")
    return {"dataset_uri": f"s3://{ctx.bucket}/datasets/*.pq"}


def _unreachable(ctx: Ctx) -> dict[str, Any]:
    ctx.monkeypatch.setenv("AWS_ACCESS_KEY_ID", "rbtest-unreachable")
    ctx.monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CLI_SECRET)
    port = _s3.closed_port()
    options = {"aws_endpoint_url": f"http://127.0.0.1:{port}", "connect_timeout": "1", "max_attempts": "1"}
    return {"dataset_uri": "s3://bucket/eval.parquet", "storage_options": options}


DUPLICATES = assign(rows(5), "row_id", ["a", "b", "c", "b", "a"])


def _with_column(name: str, values: pa.Array) -> pa.Table:
    """rows() plus one pass-through column ``name`` of ``values`` (4 values), its type kept as given."""
    return table(rows()).append_column(name, values)


def _duplicate_names(second: str) -> pa.Table:
    t = table(rows())
    return pa.Table.from_arrays([*t.columns, t.column("category")], names=[*t.column_names, second])


REFUSED = [
    Refused(
        "missing-expected_output-column",
        lambda c: _data(c, drop(rows(), "ground_truth")),
        DatasetError,
        ["no expected_output column", "ground_truth", "--column expected_output=NAME", "file {uri}"],
    ),
    Refused(
        "missing-context-column",
        lambda c: _data(c, drop(rows(), "contexts")),
        DatasetError,
        ["no retrieval_context column", "retrieved_contexts", "the file has row_id, question", "file {uri}"],
    ),
    Refused(
        "coverage-missing-actual_output-column",
        lambda c: {**_data(c, rows()), "metric": "context_coverage"},
        DatasetError,
        ["no actual_output column for context_coverage", "response", "file {uri}"],
    ),
    Refused(
        "int-expected_output",
        lambda c: _data(c, assign(rows(), "ground_truth", [1, 2, 3, 4])),
        DatasetError,
        ["expected string, found int64", "column 'ground_truth'", "file {uri}"],
    ),
    Refused(
        "int-input",
        lambda c: _data(c, assign(rows(), "question", [1, 2, 3, 4])),
        DatasetError,
        ["input: expected string, found int64", "column 'question'", "file {uri}"],
    ),
    Refused(
        "struct-context",
        lambda c: _data(c, assign(rows(), "contexts", [{"text": "a"}] * 4), contexts=None),
        DatasetError,
        ["expected list<string>, found struct<text: string>", "column 'contexts'", "file {uri}"],
    ),
    Refused(
        "list-int-context",
        lambda c: _data(c, assign(rows(), "contexts", [[1, 2]] * 4), contexts=pa.list_(pa.int64())),
        DatasetError,
        ["expected list<string>, found list<int64>", "column 'contexts'", "file {uri}"],
    ),
    Refused(
        "string-context-not-list",
        lambda c: _data(c, assign(rows(), "contexts", ["one chunk"] * 4), contexts=pa.string()),
        DatasetError,
        ["expected list<string>, found string", "column 'contexts'", "file {uri}"],
    ),
    Refused(
        "non-string-chunks-binary",
        lambda c: _data(c, assign(rows(), "contexts", [[b"raw"]] * 4), contexts=pa.list_(pa.binary())),
        DatasetError,
        ["expected list<string>, found list<binary>", "column 'contexts'", "file {uri}"],
    ),
    Refused(
        "non-string-chunks-float",
        lambda c: _data(c, assign(rows(), "contexts", [[0.5]] * 4), contexts=pa.large_list(pa.float64())),
        DatasetError,
        ["expected list<string>, found large_list<double>", "column 'contexts'"],
    ),
    Refused(
        "duplicate-row-ids",
        lambda c: _data(c, DUPLICATES),
        DatasetError,
        ["row_id must be unique; 2 duplicate(s)", "'b' (rows 1 and 3 of {uri})", "'a' (rows 0 and 4 of {uri})"],
    ),
    Refused(
        "duplicate-row-ids-across-files",
        lambda c: _folder_with_two(c, rows(2)),
        DatasetError,
        ["2 duplicate(s)", "'r0' (rows 0 of {uri}/part-0.parquet and 0 of {uri}/part-1.parquet)"],
    ),
    Refused(
        "null-row_id",
        lambda c: _data(c, assign(rows(), "row_id", ["a", "b", None, "d"])),
        DatasetError,
        ["row_id is null", "file {uri}, row 2, column 'row_id'"],
    ),
    Refused(
        "empty-row_id",
        lambda c: _data(c, assign(rows(), "row_id", ["a", "", "c", "d"])),
        DatasetError,
        ["row_id is empty", "file {uri}, row 1, column 'row_id'"],
    ),
    Refused(
        "float-row_id",
        lambda c: _data(c, assign(rows(), "row_id", [1.5, 2.5, 3.5, 4.5])),
        DatasetError,
        ["row_id: expected string or integer, found double", "column 'row_id'", "file {uri}"],
    ),
    Refused(
        "corrupted-random-bytes",
        _random_bytes,
        DatasetError,
        ["not a readable Parquet file", "file {uri}"],
    ),
    Refused("truncated-parquet", _truncated, DatasetError, ["not a readable Parquet file", "file {uri}"]),
    Refused(
        "zero-rows",
        lambda c: _data(c, table(rows()).slice(0, 0)),
        DatasetError,
        ["dataset has no rows", "{uri} holds 0 rows"],
    ),
    Refused(
        "zero-rows-in-every-file",
        _zero_row_folder,
        DatasetError,
        ["dataset has no rows", "(2 files) holds 0 rows"],
    ),
    Refused(
        "folder-without-files",
        _empty_folder,
        DatasetError,
        ["no Parquet files found: the folder is empty", "file {uri}"],
    ),
    Refused(
        "folder-without-parquet",
        _folder_without_parquet,
        DatasetError,
        ["no Parquet files found", "no .parquet/.pq files (2 other file(s)", "file {uri}"],
    ),
    Refused(
        "glob-matching-nothing",
        lambda c: {"dataset_uri": str(c.tmp / "data" / "nothing-*.parquet")},
        DatasetError,
        ["no Parquet files found: the glob matched no files", "file {uri}"],
    ),
    Refused(
        "two-files-different-types",
        lambda c: _folder_with_two(c, assign(rows(2), "category", [1, 2])),
        DatasetError,
        [
            "schema differs from the first file {uri}/part-0.parquet",
            "expected string, found int64",
            "file {uri}/part-1.parquet",
            "column 'category'",
        ],
    ),
    Refused(
        "two-files-different-columns",
        lambda c: _folder_with_two(c, drop(assign(rows(2), "row_id", ["x", "y"]), "category")),
        DatasetError,
        ["schema differs from the first file", "'category' missing", "file {uri}/part-1.parquet"],
    ),
    Refused(
        "missing-local-file",
        lambda c: {"dataset_uri": str(c.tmp / "data" / "nope.parquet")},
        StorageError,
        ["dataset not found: {uri}"],
    ),
    Refused(
        "uri-without-path",
        lambda c: {"dataset_uri": "s3://"},
        DatasetError,
        ["the dataset URI 's3://' has no path"],
    ),
    Refused(
        "unknown-protocol",
        lambda c: {"dataset_uri": "nosuchproto://x/y.parquet"},
        DatasetError,
        ["unknown protocol 'nosuchproto://'", "file nosuchproto://x/y.parquet"],
    ),
    Refused(
        "output-unknown-protocol",
        lambda c: {**_data(c, rows()), "output_uri": "nosuchproto://bucket/out"},
        ConfigError,
        ["nosuchproto://bucket/out"],
    ),
    Refused(
        "column-override-not-in-file",
        lambda c: {**_data(c, rows()), "columns": {"expected_output": "answer_text"}},
        DatasetError,
        ["column 'answer_text' given for expected_output is not in the file", "it has row_id, question", "{uri}"],
    ),
    Refused(
        "column-override-wrong-type",
        lambda c: {
            **_data(c, assign(rows(), "score", [1, 2, 3, 4])),
            "columns": {"expected_output": "score"},
        },
        DatasetError,
        ["expected_output: expected string, found int64", "column 'score'", "file {uri}"],
    ),
    Refused(
        "column-override-unknown-role",
        lambda c: {**_data(c, rows()), "columns": {"ground_truth_text": "ground_truth"}},
        DatasetError,
        ["unknown role 'ground_truth_text'", "roles are input, expected_output, retrieval_context"],
    ),
    Refused(
        "segment-by-unknown-column",
        lambda c: {**_data(c, rows()), "segment_by": ["language"]},
        DatasetError,
        ["--segment-by language: not a pass-through column; available: category", "column 'language'", "{uri}"],
    ),
    Refused(
        "time64-passthrough",
        lambda c: _data(c, _with_column("at", pa.array([1, 2, 3, 4], pa.time64("us")))),
        DatasetError,
        ["pass-through column of type time64[us] cannot be stored", "no time-of-day type", "file {uri}", "'at'"],
    ),
    Refused(
        "duration-passthrough",
        lambda c: _data(c, _with_column("took", pa.array([1, 2, 3, 4], pa.duration("ms")))),
        DatasetError,
        ["type duration[ms] cannot be stored", "no duration type: cast it to int64", "column 'took'", "file {uri}"],
    ),
    Refused(
        "decimal256-passthrough",
        lambda c: _data(c, _with_column("big", pa.array([1, 2, 3, 4]).cast(pa.decimal256(40, 0)))),
        DatasetError,
        ["type decimal256(40, 0) cannot be stored", "at most 38 digits", "column 'big'", "file {uri}"],
    ),
    Refused(
        "time-in-a-struct-passthrough",
        lambda c: _data(c, _with_column("meta", pa.array([{"d": 5}] * 4, pa.struct([("d", pa.time32("s"))])))),
        DatasetError,
        ["type struct<d: time32[ms]> cannot be stored", "no time-of-day type", "column 'meta'", "file {uri}"],
    ),
    Refused(
        "reserved-name-collision-ignoring-case",
        lambda c: _data(
            c, _with_column("Score", pa.array([1, 2, 3, 4])).append_column("data_score", pa.array([1] * 4))
        ),
        DatasetError,
        ["'Score' and 'data_score' would both be stored as", "compared ignoring case", "file {uri}"],
    ),
    Refused(
        "duplicate-column-names",
        lambda c: _data(c, _duplicate_names("category")),
        DatasetError,
        ["duplicate column names: column 'category' appears twice", "file {uri}", "column 'category'"],
    ),
    Refused(
        "column-names-differing-only-in-case",
        lambda c: _data(c, _duplicate_names("Category")),
        DatasetError,
        ["duplicate column names: columns 'category' and 'Category' differ only in case", "file {uri}"],
    ),
    Refused(
        "segment-by-list-column",
        lambda c: {
            **_data(c, _with_column("tags", pa.array([["x"], ["y"], [], None], pa.list_(pa.string())))),
            "segment_by": ["tags"],
        },
        DatasetError,
        ["--segment-by tags: a list<string> column cannot segment a run", "column 'tags'", "file {uri}"],
    ),
    Refused(
        "segment-by-struct-column",
        lambda c: {
            **_data(c, _with_column("meta", pa.array([{"a": 1}] * 4, pa.struct([("a", pa.int64())])))),
            "segment_by": ["meta"],
        },
        DatasetError,
        ["--segment-by meta: a struct<a: int64> column cannot segment a run", "column 'meta'"],
    ),
    Refused(
        "s3-missing-object",
        _s3_missing_object,
        StorageError,
        ["dataset not found: {uri}"],
        s3=True,
    ),
    Refused(
        "s3-missing-bucket",
        _s3_missing_bucket,
        StorageError,
        ["dataset not found: {uri}", "bucket s3://rb-no-such-bucket-7f3a does not exist"],
        s3=True,
    ),
    Refused(
        "s3-wrong-credentials",
        _s3_wrong_credentials,
        StorageError,
        ["access denied", "AWS_SECRET_ACCESS_KEY", "{uri}"],
        s3=True,
        absent=[CLI_SECRET],
    ),
    Refused(
        "s3-corrupted-object",
        _s3_corrupted,
        DatasetError,
        ["not a readable Parquet file", "file {uri}"],
        s3=True,
    ),
    Refused(
        "s3-glob-matching-nothing",
        _s3_glob_no_match,
        DatasetError,
        ["the glob matched no files", "file {uri}"],
        s3=True,
    ),
    Refused(
        "s3-unreachable-endpoint",
        _unreachable,
        StorageError,
        ["cannot reach endpoint http://127.0.0.1:"],
        absent=[CLI_SECRET],
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in REFUSED])
def test_refused_before_judging_or_writing(ctx: Ctx, request: pytest.FixtureRequest, case: Refused) -> None:
    if case.s3:
        with_s3(ctx, request)
    kwargs = case.make(ctx)
    ctx.out = kwargs.get("output_uri", ctx.out)
    with pytest.raises(case.error) as info:
        run_flow(ctx, **kwargs)
    message = str(info.value)
    fmt = {"uri": kwargs["dataset_uri"], "tmp": str(ctx.tmp)}
    for needle in case.needles:
        assert needle.format(**fmt) in message, f"{needle.format(**fmt)!r} not in {message!r}"
    for secret in [KEY, *case.absent, *([ctx.s3.secret_key] if ctx.s3 else [])]:
        assert secret not in message
    assert "\n" not in message
    assert ctx.fake.chat_requests == []
    nothing_written(ctx)


# ------------------------------------------------------------------------------ handled: through the flow


@dataclass
class Handled:
    """A bad value in some rows: the run completes, the rows follow the documented handling and are counted."""

    id: str
    data: Callable[[], pa.Table]
    expect: dict[str, int]  # subset of the run summary
    bad_rows: dict[str, str]  # row_id -> the field named in its error/flag/reason
    on_missing: str = "error"
    scores: dict[str, float | None] = field(default_factory=dict)  # row_id -> expected score
    params: dict[str, Any] = field(default_factory=dict)  # more run options

    def param(self) -> Any:
        return pytest.param(self, id=self.id)


def _with(column: str, values: dict[int, Any], typ: pa.DataType | None = None) -> Callable[[], pa.Table]:
    def make() -> pa.Table:
        data = rows()
        for i, v in values.items():
            data[i][column] = v
        return table(data, **({"contexts": typ} if typ is not None else {}))

    return make


def _null_list_context() -> pa.Table:
    t = table(rows())
    return t.set_column(t.schema.get_field_index("contexts"), "contexts", pa.array([[None]] * 4, pa.list_(pa.null())))


BIG_CHUNK = "alpha bravo matter " + "filler words " * 81_000  # ~1 MB


HANDLED = [
    Handled(
        "null-expected_output-error",
        _with("ground_truth", {1: None, 2: None}),
        {"rows": 4, "scored": 2, "errors": 2, "skipped": 0},
        {"r1": "expected_output", "r2": "expected_output"},
    ),
    Handled(
        "null-expected_output-skip",
        _with("ground_truth", {1: None, 2: None}),
        {"rows": 4, "scored": 2, "errors": 0, "skipped": 2},
        {"r1": "expected_output", "r2": "expected_output"},
        on_missing="skip",
        scores={"r0": 1.0, "r1": None, "r2": None},
    ),
    Handled(
        "null-expected_output-zero",
        _with("ground_truth", {1: None, 2: None}),
        {"rows": 4, "scored": 4, "errors": 0, "skipped": 0},
        {"r1": "expected_output", "r2": "expected_output"},
        on_missing="zero",
        scores={"r0": 1.0, "r1": 0.0, "r2": 0.0, "r3": 1.0},
    ),
    Handled(
        "empty-string-expected_output",
        _with("ground_truth", {0: ""}),
        {"rows": 4, "scored": 3, "errors": 1},
        {"r0": "expected_output"},
    ),
    Handled(
        "whitespace-only-expected_output",
        _with("ground_truth", {3: " \t\n  "}),
        {"rows": 4, "scored": 3, "errors": 1},
        {"r3": "expected_output"},
    ),
    Handled(  # a reference with no letter, or only what looks like a list marker, is one sentence: judged
        "short-references-are-judged",
        _with("ground_truth", {0: "42.", 1: "a.", 2: "?!"}),
        {"rows": 4, "scored": 4, "errors": 0, "skipped": 0},
        {},
        on_missing="skip",
    ),
    Handled(
        "null-context",
        _with("contexts", {0: None}),
        {"rows": 4, "scored": 3, "errors": 1},
        {"r0": "retrieval_context"},
    ),
    Handled(
        "empty-context-list",
        _with("contexts", {0: [], 3: []}),
        {"rows": 4, "scored": 2, "errors": 2},
        {"r0": "retrieval_context", "r3": "retrieval_context"},
    ),
    Handled(
        "context-of-empty-strings",
        _with("contexts", {1: ["", "  "]}),
        {"rows": 4, "scored": 4, "errors": 0},
        {"r1": "retrieval_context"},
        on_missing="zero",
        scores={"r1": 0.0, "r0": 1.0},
    ),
    Handled(
        "context-with-null-items",
        _with("contexts", {2: [None, None]}),
        {"rows": 4, "scored": 3, "skipped": 1},
        {"r2": "retrieval_context"},
        on_missing="skip",
    ),
    Handled(
        "context-list<null>-only",
        _null_list_context,
        {"rows": 4, "scored": 0, "errors": 4},
        {"r0": "retrieval_context", "r1": "retrieval_context", "r2": "retrieval_context", "r3": "retrieval_context"},
    ),
    Handled(
        "one-megabyte-chunk",
        _with("contexts", {0: [BIG_CHUNK, "unrelated"]}),
        {"rows": 4, "scored": 4, "errors": 0},
        {},
        scores={"r0": 1.0, "r1": 1.0},
        params={"on_overlong": "send"},  # over gpt-4o-mini's window: refused unsent by default (test below)
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in HANDLED])
def test_handled_per_row_and_counted(ctx: Ctx, case: Handled) -> None:
    data = write(ctx.data, case.data())
    try:
        summary = run_flow(ctx, dataset_uri=data, on_missing=case.on_missing, **case.params)
    except RunFailed as exc:  # committed with status failed: any error in 4 rows is above --max-error-rate
        summary = exc.summary
    assert summary["status"] == ("failed" if summary["errors"] else "completed")
    assert {k: summary[k] for k in case.expect} == case.expect
    # the judge is asked only about rows that can be judged
    assert len(ctx.fake.chat_requests) == 4 - len(case.bad_rows)
    results = {r["row_id"]: r for r in DeltaTable(str(Path(ctx.out) / "results")).to_pyarrow_table().to_pylist()}
    assert set(results) == {"r0", "r1", "r2", "r3"}
    for row_id, missing in case.bad_rows.items():
        r = results[row_id]
        said = " ".join(str(x) for x in (r["error"], r["reason"], *(r["flags"] or [])) if x)
        assert missing in said, (row_id, said)
        if case.on_missing == "error":
            assert r["error"] and "--on-missing" in r["error"] and r["score"] is None
        elif case.on_missing == "skip":
            assert r["skipped"] and r["score"] is None and r["error"] is None
        else:
            assert r["score"] == 0.0 and r["error"] is None
    for row_id, score in case.scores.items():
        assert results[row_id]["score"] == (pytest.approx(score) if score is not None else None)


def test_a_one_megabyte_chunk_over_the_models_window_is_that_rows_error_unsent(ctx: Ctx) -> None:
    """By default (``--on-overlong refuse``) a context over the model's window costs no request: the row's error
    names the window and the way out; the other rows are judged."""
    data = write(ctx.data, _with("contexts", {0: [BIG_CHUNK, "unrelated"]})())
    with pytest.raises(RunFailed) as failed:  # 1 of 4 rows errored: above --max-error-rate
        run_flow(ctx, dataset_uri=data)
    assert {k: failed.value.summary[k] for k in ("rows", "scored", "errors")} == {"rows": 4, "scored": 3, "errors": 1}
    assert len(ctx.fake.chat_requests) == 3
    results = {r["row_id"]: r for r in DeltaTable(str(Path(ctx.out) / "results")).to_pyarrow_table().to_pylist()}
    error = results["r0"]["error"]
    assert error.startswith("ContextOverflowError") and "--on-overlong" in error, error
    assert results["r0"]["requests"] == 0


def test_corrupted_data_page_stops_the_run_without_commit(ctx: Ctx) -> None:
    """A valid footer over a corrupted data page: found only when that row group is read (validation reads
    footers). Documented handling: a clear error naming file, row group and rows; nothing committed; the
    blocks judged before it are not visible to readers."""
    ctx.data.parent.mkdir(parents=True)
    pq.write_table(table(rows(40)), ctx.data, row_group_size=20)
    data = str(ctx.data)
    group = pq.ParquetFile(ctx.data).metadata.row_group(1).column(2)  # ground_truth of rows 20-39
    blob = bytearray(ctx.data.read_bytes())
    for i in range(group.data_page_offset, group.data_page_offset + 24):
        blob[i] ^= 0xFF
    ctx.data.write_bytes(bytes(blob))
    with pytest.raises(DatasetError) as info:
        run_flow(ctx, dataset_uri=data, chunk_size=10, max_workers=1)
    message = str(info.value)
    assert "row group 1 (rows 20-39) cannot be read" in message and f"file {data}" in message
    assert "\n" not in message
    assert len(ctx.fake.chat_requests) <= 20  # only rows of the readable row group were judged
    out = Path(ctx.out)
    assert not (out / "results").exists() and not (out / "runs").exists()


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_passthrough_type_differing_from_the_results_table_is_refused_before_judging(ctx: Ctx, fmt: str) -> None:
    """A later dataset whose pass-through column has another type than the output's results table."""
    first = run_flow(ctx, dataset_uri=write(ctx.tmp / "a" / "eval.parquet", rows()), format=fmt)
    assert first["scored"] == 4
    ctx.fake.reset()
    other = write(ctx.tmp / "b" / "eval.parquet", assign(rows(), "category", [1, 2, 3, 4]))
    with pytest.raises(DatasetError) as info:
        run_flow(ctx, dataset_uri=other, format=fmt)
    message = str(info.value)
    assert "pass-through column is int64, but the results table" in message
    assert "has 'category' as string: cast the column, rename it, or write to another --output" in message
    assert f"file {other}" in message and "column 'category'" in message and "\n" not in message
    assert ctx.fake.chat_requests == []
    store = ResultStore(ctx.out, StorageConfig.from_options(), fmt)  # type: ignore[arg-type]
    runs = store.read_table("runs").to_table()
    assert runs.column("run_id").to_pylist() == [first["run_id"]]  # nothing committed by the refused run
    assert store.read_table("results").count_rows() == 4
    assert not list(Path(ctx.out).glob("_chunks/*/*/*.parquet"))[4:]  # no chunk file of the refused run


def test_pandas_style_passthrough_types_are_stored_readably(ctx: Ctx) -> None:
    """timestamp[ns] (values not whole microseconds), uint64 >= 2^63, float16, categoricals, Score/Reason/Error
    columns: run twice into one output, then query and history still read it."""
    from typer.testing import CliRunner

    from recall_tasks.cli.app import app

    data = table(rows())
    extra = {
        "seen_at": pa.array([1_700_000_000_123_456_789 + i for i in range(4)], pa.timestamp("ns")),
        "seen_at_tz": pa.array([1_700_000_000_123_456_789] * 4, pa.timestamp("ns", tz="Europe/Berlin")),
        "big": pa.array([2**63 + 5, 0, 1, 2**64 - 1], pa.uint64()),
        "small": pa.array([1, 2, 3, 255], pa.uint8()),
        "half": pa.array([0.5, 1.5, 2.5, None], pa.float32()).cast(pa.float16()),
        "team": pa.array(["x", "y", "x", None]).dictionary_encode(),
        "amount": pa.array([Decimal(i) for i in range(4)], pa.decimal256(10, 0)),
        "Score": pa.array([9.0, 8.0, 7.0, 6.0]),
        "Reason": pa.array(["r"] * 4),
        "Error": pa.array(["e"] * 4),
    }
    for name, values in extra.items():
        data = data.append_column(name, values)
    uri = write(ctx.data, data.set_column(1, "question", data.column("question").dictionary_encode()))
    first = run_flow(ctx, dataset_uri=uri, segment_by=["team"])
    second = run_flow(ctx, dataset_uri=uri, segment_by=["team"])
    assert first["scored"] == second["scored"] == 4 and first["errors"] == 0
    results = DeltaTable(str(Path(ctx.out) / "results")).to_pyarrow_table()
    assert results.num_rows == 8
    schema = results.schema
    assert schema.field("seen_at").type == pa.timestamp("us") and schema.field("seen_at_tz").type.unit == "us"
    assert schema.field("big").type == pa.decimal128(20, 0) and schema.field("small").type == pa.int16()
    assert schema.field("half").type == pa.float32() and schema.field("team").type == pa.string()
    assert {"data_Score", "data_Reason", "data_Error", "score", "reason", "error"} <= set(schema.names)
    row = next(r for r in results.to_pylist() if r["row_id"] == "r0")
    assert row["big"] == 2**63 + 5 and row["small"] == 1 and row["data_Score"] == 9.0 and row["score"] == 1.0
    assert row["seen_at"].microsecond == 123456  # truncated to the microsecond (789 ns dropped)
    assert row["input"] == "What about item 0?"
    runner = CliRunner()
    query = runner.invoke(
        app, ["query", "SELECT count(*) AS n, max(big) AS b FROM results", "--output", ctx.out], env={"COLUMNS": "200"}
    )
    assert query.exit_code == 0 and "8" in query.output and "18446744073709551615" in query.output, query.output
    history = runner.invoke(app, ["history", "--output", ctx.out], env={"COLUMNS": "400"})
    assert history.exit_code == 0 and second["run_id"] in history.output, history.output


# ------------------------------------------------------------------------------------ refused: parameters


PARAMS = [
    pytest.param({"threshold": -0.1}, "threshold", "greater than or equal to 0", id="negative-threshold"),
    pytest.param({"threshold": 2.0}, "threshold", "threshold 2.0 is above scale 1.0", id="threshold-above-scale"),
    pytest.param(
        {"threshold": 7.0, "scale": 5.0}, "threshold", "threshold 7.0 is above scale 5.0", id="threshold-above-scale5"
    ),
    pytest.param({"scale": 0}, "scale", "greater than 0", id="zero-scale"),
    pytest.param({"chunk_size": 0}, "chunk_size", "greater than or equal to 1", id="chunk-size-zero"),
    pytest.param({"output_uri": ""}, "output_uri", "names no folder or bucket", id="empty-output-uri"),
    pytest.param({"dataset_uri": ""}, "dataset_uri", "at least 1 character", id="empty-dataset-uri"),
    pytest.param({"output_uri": "s3://"}, "output_uri", "names no folder or bucket", id="output-without-path"),
    pytest.param({"on_missing": "ignore"}, "on_missing", "'error', 'zero' or 'skip'", id="on-missing-invalid"),
    pytest.param(
        {"metric": "recall"},
        "metric",
        "'contextual_recall', 'context_coverage' or 'retrieval_ids'",
        id="unknown-metric",
    ),
    pytest.param({"treshold": 0.3}, "treshold", "Extra inputs are not permitted", id="misspelt-parameter"),
    pytest.param(
        {"storage_options": {"aws_secret_access_key": CLI_SECRET}},
        "storage_options",
        "look secret",
        id="secret-in-storage-options",
    ),
    pytest.param(
        {"base_url": f"http://judge-user:{CLI_SECRET}@127.0.0.1:9/v1"},
        "base_url",
        "the judge endpoint URL holds a user name or password before 127.0.0.1: remove it and pass the key through "
        "OPENAI_API_KEY",
        id="credentials-in-base-url",
    ),
    pytest.param(
        {"base_url": f"http://127.0.0.1:9/v1?api-key={CLI_SECRET}"},
        "base_url",
        "secret-looking query parameter (api-key)",
        id="key-in-base-url-query",
    ),
]


@pytest.mark.parametrize(("extra", "field_name", "needle"), PARAMS)
def test_invalid_parameters_name_the_field(ctx: Ctx, extra: dict[str, Any], field_name: str, needle: str) -> None:
    data = write(ctx.data, rows())
    with pytest.raises(ValidationError) as info:
        run_flow(ctx, **{"dataset_uri": data, **extra})
    text = str(info.value)
    assert field_name in text and needle in text
    assert CLI_SECRET not in text
    assert ctx.fake.chat_requests == []
    nothing_written(ctx)


def test_invalid_parameters_refused_by_the_flow_itself(ctx: Ctx) -> None:
    """A deployment passes a dict: the flow validates it (pydantic) before the run starts."""
    data = write(ctx.data, rows())
    with pytest.raises(ParameterTypeError, match="chunk_size") as info:
        recall_benchmark({"dataset_uri": data, "output_uri": ctx.out, "chunk_size": 0})  # type: ignore[arg-type]
    assert "greater than or equal to 1" in str(info.value)
    nothing_written(ctx)


# --------------------------------------------------------------------------------------------------- CLI


@dataclass
class CliCase:
    id: str
    args: Callable[[Ctx], list[str]]  # after "run"
    needles: list[str]
    s3: bool = False
    absent: list[str] = field(default_factory=list)
    one_line: bool = True  # False for click usage errors (usage + boxed message)
    xfail: str | None = None

    def param(self) -> Any:
        marks = [pytest.mark.xfail(strict=True, reason=self.xfail)] if self.xfail else []
        return pytest.param(self, id=self.id, marks=marks)


def _cli_data(ctx: Ctx, *more: str) -> list[str]:
    return [write(ctx.data, rows()), "--output", ctx.out, *more]


def _cli_secret_option(ctx: Ctx) -> list[str]:
    assert ctx.s3 is not None
    uri = ctx.upload(write(ctx.data, rows()), "datasets/eval.parquet")
    ctx.monkeypatch.setenv("AWS_ACCESS_KEY_ID", ctx.s3.access_key)
    # the CLI moves credential options into this process's AWS_* variables: let monkeypatch restore them
    ctx.monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "placeholder")
    return [
        uri,
        "--output",
        ctx.out,
        "--storage-option",
        f"aws_endpoint_url={ctx.s3.endpoint_url}",
        "--storage-option",
        f"aws_secret_access_key={CLI_SECRET}",
    ]


CLI = [
    CliCase(
        "missing-file",
        lambda c: [str(c.tmp / "missing.parquet"), "--output", c.out],
        ["error:", "dataset not found:", "missing.parquet"],
    ),
    CliCase("unknown-column-role", lambda c: _cli_data(c, "--column", "answerz=ground_truth"), ["unknown role"]),
    CliCase("column-without-name", lambda c: _cli_data(c, "--column", "expected_output"), ["role=column_name"]),
    CliCase(
        "column-not-in-file",
        lambda c: _cli_data(c, "--column", "expected_output=nope"),
        ["'nope' given for expected_output is not in the file"],
    ),
    CliCase("segment-by-missing", lambda c: _cli_data(c, "--segment-by", "lang"), ["--segment-by lang"]),
    CliCase("on-missing-invalid", lambda c: _cli_data(c, "--on-missing", "drop"), ["on_missing"]),
    CliCase("unknown-metric", lambda c: _cli_data(c, "--metric", "precision"), ["metric"]),
    CliCase("chunk-size-zero", lambda c: _cli_data(c, "--chunk-size", "0"), ["chunk_size"]),
    CliCase(
        "threshold-above-scale",
        lambda c: _cli_data(c, "--threshold", "3"),
        ["error: threshold 3.0 is above scale 1.0"],
    ),
    CliCase(
        "glob-with-brackets-matching-nothing",
        lambda c: [str(c.tmp / "data" / "[xy]*.parquet"), "--output", c.out],
        ["the glob matched no files", "[xy]*.parquet"],
    ),
    CliCase("empty-uri", lambda c: ["", "--output", c.out], ["dataset_uri: String should have at least 1 character"]),
    CliCase(
        "secret-storage-option",
        _cli_secret_option,
        ["access denied"],
        s3=True,
        absent=[CLI_SECRET],
    ),
    CliCase(
        "unknown-credential-option",
        lambda c: _cli_data(c, "--storage-option", f"my_password={CLI_SECRET}"),
        ["unknown credential option"],
        absent=[CLI_SECRET],
        one_line=False,
    ),
    CliCase(
        "namespace-trailing-dot",
        lambda c: _cli_data(c, "--format", "iceberg", "--namespace", "a."),
        ["error: namespace: --namespace 'a.': an Iceberg namespace is one or more names separated by single dots"],
    ),
    CliCase(
        "namespace-double-dot",
        lambda c: _cli_data(c, "--format", "iceberg", "--namespace", "a..b"),
        ["--namespace 'a..b':", "none empty"],
    ),
    CliCase(
        "namespace-leading-dot",
        lambda c: _cli_data(c, "--format", "iceberg", "--namespace", ".a"),
        ["--namespace '.a':", "none empty"],
    ),
    CliCase("max-cost-infinite", lambda c: _cli_data(c, "--max-cost-usd", "inf"), ["max_cost_usd", "finite number"]),
    CliCase("max-cost-nan", lambda c: _cli_data(c, "--max-cost-usd", "nan"), ["max_cost_usd"]),
    CliCase("max-cost-zero", lambda c: _cli_data(c, "--max-cost-usd", "0"), ["max_cost_usd", "greater than 0"]),
    CliCase(
        "malformed-storage-option",
        lambda c: _cli_data(c, "--storage-option", CLI_SECRET),
        ["invalid --storage-option #1", "chars hidden"],
        absent=[CLI_SECRET],
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in CLI])
def test_cli_exits_2_with_one_line(ctx: Ctx, request: pytest.FixtureRequest, case: CliCase) -> None:
    from typer.testing import CliRunner

    from recall_tasks.cli.app import app

    if case.s3:
        with_s3(ctx, request)
        ctx.out = str(ctx.tmp / "out")  # the output stays local: the secret is for the dataset's bucket
    judge = ["--judge", "openai", "--base-url", ctx.fake.base_url]
    result = CliRunner().invoke(app, ["run", *case.args(ctx), *judge], env={"COLUMNS": "400"})
    output = result.output
    assert result.exit_code == 2, output
    assert "Traceback" not in output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in output.splitlines() if line.strip()]
    if lines and lines[0].startswith("judge: openai "):  # the judge in use, printed (stderr) as a run starts
        lines = lines[1:]
    assert len(lines) == 1 or not case.one_line, output
    for needle in case.needles:
        assert needle in output, output
    for secret in [KEY, *case.absent]:
        assert secret not in output
    assert ctx.fake.chat_requests == []
    nothing_written(ctx)


def test_cli_refuses_credentials_in_base_url_before_any_flow_run(ctx: Ctx) -> None:
    """The password is never echoed, and never reaches Prefect (no flow run stores it as a parameter)."""
    from prefect.client.orchestration import get_client
    from typer.testing import CliRunner

    from recall_tasks.cli.app import app

    url = f"http://judge-user:{CLI_SECRET}@127.0.0.1:{ctx.fake.port}/v1"
    args = ["run", *_cli_data(ctx), "--judge", "openai", "--base-url", url]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [
        "error: base_url: the judge endpoint URL holds a user name or password before 127.0.0.1: remove it and pass "
        "the key through OPENAI_API_KEY (credentials in parameters are stored in Prefect's database)"
    ]
    assert CLI_SECRET not in result.output and "judge-user" not in result.output
    with get_client(sync_client=True) as client:
        stored = [str(r.parameters) for r in client.read_flow_runs(limit=200)]
    assert not any(CLI_SECRET in p for p in stored)
    assert ctx.fake.chat_requests == []
    nothing_written(ctx)


def test_cli_error_is_one_line_at_default_width(ctx: Ctx) -> None:
    """Without COLUMNS, a long path must not be wrapped over several lines (logs and alerts grep one line)."""
    from typer.testing import CliRunner

    from recall_tasks.cli.app import app

    deep = ctx.tmp / ("a-rather-long-folder-name-" * 4) / "missing.parquet"
    result = CliRunner().invoke(app, ["run", str(deep), "--output", ctx.out])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[0].startswith("judge: lexical (offline approximation")  # the judge in use, first (stderr)
    lines = lines[1:]
    assert len(lines) == 1, result.output
    assert str(deep) in result.output
    assert re.match(r"^error: dataset not found", lines[0])
