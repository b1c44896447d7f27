"""``--id-pattern`` is matched in linear time (issue 58): RE2 syntax, one group, refused at validation otherwise.

A pattern that backtracks exponentially (``^(a+)+$``) or quadratically (``(.+)::`` on a long id) under Python's
``re`` blocked the pre-run checks of a run (a deployment parameter: anyone who can start one could block it).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from recall_tasks.cli.app import app
from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError, DatasetError
from recall_tasks.id_params import IdPattern, compile_id_pattern
from recall_tasks.metrics.ids_compute import normalise_ids

ROOT = Path(__file__).resolve().parents[1]

#: The pre-run checks of a retrieval_ids run (what ``--dry-run`` does first), in a process of its own: one that
#: hangs is killed, not left spinning in this one (Python's ``re`` holds the GIL while it backtracks).
CHECK = """
import sys
from recall_tasks.config import RunParams
from recall_tasks.pipeline.steps import check_run
data, out, pattern = sys.argv[1:4]
try:
    check_run(RunParams(dataset_uri=data, output_uri=out, metric="retrieval_ids", id_pattern=pattern), contact=False)
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
else:
    print("accepted")
"""


def dataset(path: Path, retrieved: list[list[str]]) -> str:
    rows = [
        {"question": f"q{i}", "answer": "a", "contexts": ["c"], "retrieved_context_ids": ids,
         "reference_context_ids": ["doc-1"]}
        for i, ids in enumerate(retrieved)
    ]  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def checked(tmp_path: Path, pattern: str, retrieved: list[list[str]]) -> str:
    """What the pre-run checks say, from a process given 30 s (the checks take well under one)."""
    data = dataset(tmp_path / "data" / "eval.parquet", retrieved)
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHECK, data, str(tmp_path / "out"), pattern],
            capture_output=True, text=True, timeout=30, cwd=ROOT,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"the checks of --id-pattern {pattern!r} did not finish in 30 s")
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "out").exists()
    return done.stdout.strip()


@pytest.mark.concurrency  # a process of its own
def test_a_nested_quantifier_on_a_41_character_id_is_checked_at_once(tmp_path: Path) -> None:
    said = checked(tmp_path, "^(a+)+$", [["a" * 41], ["a" * 40 + "!"]])
    assert said.startswith("DatasetError: the chunk id 'aaaa") and "does not match" in said, said
    assert "row 1" in said and "'retrieved_context_ids'" in said, said


@pytest.mark.concurrency  # a process of its own
def test_a_greedy_group_on_30000_character_ids_is_checked_at_once(tmp_path: Path) -> None:
    long_ids = [f"{i}-" + "a" * 30_000 for i in range(20)]  # no "::": Python's re tried every start, ~5 s each
    said = checked(tmp_path, "(.+)::", [["doc-1::chunk-0"], long_ids])
    assert said.startswith("DatasetError: the chunk id '0-aaaa") and "row 1" in said, said
    assert len(said) < 600  # the id in the message is cut


def test_a_long_id_that_matches_gives_its_document_id() -> None:
    long_doc = "x" * 30_000
    got = normalise_ids(
        pa.array([[f"{long_doc}::chunk-1", "doc-2::chunk-0"]]), column="c", source="f",
        chunk_to_doc=compile_id_pattern("(.+)::"),
    )  # fmt: skip
    assert got.to_pylist() == [[long_doc, "doc-2"]]


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"^(.+)::\1$", r"backreference \1"),
        (r"^(?P<doc>.+)::(?P=doc)$", "backreference (?P=name)"),
        (r"^(.+)(?=::)", "lookahead (?=...)"),
        (r"^(.+)(?!x)::", "negative lookahead (?!...)"),
        (r"(?<=doc-)(\d+)", "lookbehind (?<=...)"),
        (r"(?<!x)(\d+)", "negative lookbehind (?<!...)"),
        (r"(?>doc)-(\d+)", "atomic group (?>...)"),
        (r"^(.+)::\d++$", "possessive quantifier ++"),
        (r"^(.+)::chunk\Z", r"\Z (write \z for the end of the id)"),
    ],
)
def test_a_construct_linear_time_matching_cannot_run_is_refused_at_validation(pattern: str, why: str) -> None:
    with pytest.raises(ValueError, match="id_pattern") as info:
        RunParams(dataset_uri="x", id_pattern=pattern)
    message = str(info.value)
    assert f"--id-pattern {pattern!r} uses a construct linear-time matching does not support ({why})" in message


def test_a_pattern_without_exactly_one_group_is_still_refused() -> None:
    for pattern, groups in ((r"^.+::", 0), (r"^(.+)::(chunk)", 2)):
        with pytest.raises(ValueError, match=rf"must have exactly one group \(the document id\), it has {groups}"):
            RunParams(dataset_uri="x", id_pattern=pattern)


def test_the_cli_refuses_a_backreference_with_one_error_line_and_exit_2(tmp_path: Path) -> None:
    data = dataset(tmp_path / "data" / "eval.parquet", [["doc-1::chunk-0"]])
    out = tmp_path / "out"
    got = CliRunner().invoke(app, ["run", data, "-o", str(out), "--id-pattern", r"(a)\1", "--dry-run"],
                             env={"COLUMNS": "200"})  # fmt: skip
    assert got.exit_code == 2, got.output
    lines = [line for line in got.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), got.output
    refused = r"--id-pattern '(a)\\1' uses a construct linear-time matching does not support (backreference \1)"
    assert refused in lines[0], lines[0]
    assert not out.exists()


IDS = [
    "doc-42::chunk-3", "doc-42::chunk-1", "doc7::c", "x doc12 doc3", "DOC-9::p", "a/b/c.txt", "v2:report::9",
    "élan::1", "日本語::二", "a::b::c", "::lead", "doc-5-chunk-7", "name#frag",
]  # fmt: skip
ORDINARY = [
    r"^(.+)::", r"(doc\d+)", r"^(.+?)::", r"(?i)(doc-\d+)", r"([^/]+)/[^/]+$", r"^(?:v\d+:)?([a-z]+)",
    r"(?P<doc>\w+)#", r"^([^:]+)", r"(.*)::", r"^(.+)-chunk-\d+$", r"(\w+)$", r"(?s)^(.+?)(?:::.*)?$",
]  # fmt: skip


@pytest.mark.parametrize("pattern", ORDINARY)
@pytest.mark.parametrize("kernel", [True, False], ids=["vectorized", "one-by-one"])
def test_ordinary_patterns_give_what_pythons_re_search_gave(pattern: str, kernel: bool) -> None:
    """The document id is the group of the first match anywhere in the id (``re.search``), as before; an id the
    pattern does not match, or whose group captures nothing, is refused (both ways of matching agree). RE2's
    ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are ASCII, as ``re.ASCII`` makes Python's."""
    compiled = compile_id_pattern(pattern)
    if not kernel:
        compiled = compiled.one_by_one()
    python = re.compile(pattern, re.ASCII)
    for chunk in IDS:
        found = python.search(chunk)
        expected = found.group(1) if found else None
        raw = pa.array([[chunk]])
        if expected:
            assert normalise_ids(raw, column="c", source="f", chunk_to_doc=compiled).to_pylist() == [[expected]], chunk
        else:
            with pytest.raises(DatasetError, match="does not match the chunk-to-document pattern"):
                normalise_ids(raw, column="c", source="f", chunk_to_doc=compiled)


def test_a_pattern_arrows_kernel_refuses_is_matched_one_by_one() -> None:
    pattern = IdPattern("^(.+)::", kernel="^(?P<doc>.+)(?=::)")  # Arrow's RE2 refuses the lookahead
    got = normalise_ids(pa.array([["doc-1::c", "doc-2::c"]]), column="c", source="f", chunk_to_doc=pattern)
    assert got.to_pylist() == [["doc-1", "doc-2"]]


def test_a_pattern_compiled_by_re_is_matched_by_re2_with_its_flags() -> None:
    """``normalise_ids`` still takes a ``re.Pattern`` (its flags kept); it is matched in linear time too."""
    got = normalise_ids(pa.array([["DOC-1::x"]]), column="c", source="f", chunk_to_doc=re.compile(r"^(doc-\d)", re.I))
    assert got.to_pylist() == [["DOC-1"]]
    with pytest.raises(ConfigError, match="linear-time matching does not support"):
        normalise_ids(pa.array([["a::a"]]), column="c", source="f", chunk_to_doc=re.compile(r"^(a)::\1$"))


def test_the_checked_pattern_is_kept_as_text(tmp_path: Any) -> None:
    """The setup of a run carries the pattern as text (it is pickled to worker processes)."""
    import pickle

    pattern = compile_id_pattern("^(?P<doc>.+)::")
    again = pickle.loads(pickle.dumps(pattern))
    assert again == pattern and again.search("doc-1::chunk-2") == "doc-1" and again.pattern == "^(?P<doc>.+)::"
