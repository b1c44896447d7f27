"""tests/scheduling.py's START_FIRST names tests that exist: a renamed test would silently lose its early start."""

from __future__ import annotations

from pathlib import Path

from tests.scheduling import START_FIRST, _start_rank

ROOT = Path(__file__).resolve().parents[1]


def test_every_start_first_prefix_names_a_test_of_its_file():
    for prefix in START_FIRST:
        path, _, name = prefix.partition("::")
        source = (ROOT / path).read_text()
        assert f"def {name}" in source, f"{prefix}: no such test (renamed? update tests/scheduling.py)"


def test_the_listed_tests_rank_in_list_order_and_the_rest_after_them():
    assert [_start_rank(prefix + "x") for prefix in START_FIRST] == list(range(len(START_FIRST)))
    assert _start_rank("tests/test_pipeline.py::test_anything") == len(START_FIRST)
