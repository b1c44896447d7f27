"""Every shell and Python block of docs/ runs in a test as written or says what it needs, as the README's do.

On the line before each ```bash / ```python block, an HTML comment: ``<!-- run by tests/test_x.py -->`` (that test
reads the block from the page and runs it: the named file must exist and name the page) or ``<!-- needs: ... -->``
(what the block needs that a test here cannot give: a shared Prefect server, a key, object storage, Spark). A new
block without either fails here, so none is left untested by oversight (issue 43: three pages' blocks failed as
written). The Python API's first example is run here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
MARKER = re.compile(r"^\s*<!-- (?:run by (tests/test_\w+\.py)|needs: (.+)) -->$")


def blocks(page: Path) -> list[tuple[str, str, str]]:
    """(the marker line before it, its language, its code) of each bash/python block, indented ones too."""
    lines = page.read_text().splitlines()
    found = []
    for i, line in enumerate(lines):
        match = re.fullmatch(r"(\s*)```(bash|python)", line)
        if match:
            before = next((b for b in reversed(lines[:i]) if b.strip()), "")
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            code = "\n".join(b.removeprefix(match.group(1)) for b in lines[i + 1 : end])
            found.append((before, match.group(2), code))
    return found


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_each_block_is_run_by_a_test_or_says_what_it_needs(page: Path) -> None:
    for before, language, code in blocks(page):
        marker = MARKER.match(before)
        assert marker, f"{page.name}: a {language} block without <!-- run by tests/... --> or <!-- needs: -->:\n{code}"
        test_file = marker.group(1)
        if test_file:
            assert (ROOT / test_file).is_file(), f"{page.name}: {test_file} does not exist"
            assert page.name in (ROOT / test_file).read_text(), f"{test_file} does not read docs/{page.name}"


def test_the_pages_hold_the_blocks_this_file_knows() -> None:
    counted = {page.name: len(blocks(page)) for page in DOCS}
    assert sum(counted.values()) >= 28 and counted["deployments.md"] >= 15, counted


def test_library_md_first_example_runs_as_written() -> None:
    page = ROOT / "docs" / "library.md"
    section = page.read_text().split("\n## The Python API\n", 1)[1].split("\n## ", 1)[0]
    (code,) = [c for _, lang, c in blocks(page) if lang == "python" and c in section]
    namespace: dict[str, Any] = {}
    exec(compile(code, str(page), "exec"), namespace)
    result = namespace["result"]
    assert round(result.score, 3) == 0.667  # "0.667: 2 of 3 sentences supported", as its comment says
    assert "He won the Nobel Prize." in result.reason  # "names the unsupported sentence"
