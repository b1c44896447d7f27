"""Every ``--help`` reads well in an 80-column terminal: nothing cut off, no option name split over two lines."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from recall_tasks.cli.app import app


def command_paths() -> list[list[str]]:
    """Every command and sub-command of ``recall-bench``, as the argument lists that reach it."""
    root = typer.main.get_command(app)
    paths: list[list[str]] = [[]]

    def walk(group, prefix: list[str]) -> None:  # typer carries its own click: groups are told by their commands
        for name, command in group.commands.items():
            paths.append([*prefix, name])
            if hasattr(command, "commands"):
                walk(command, [*prefix, name])

    walk(root, [])
    return paths


PATHS = command_paths()


def help_of(path: list[str]):
    """The help as an 80-column terminal shows it: click formats at the terminal's width minus 2 (78), while its
    test runner forces 80 unless told (a short help cut off at 78 columns showed in full at 80)."""
    return CliRunner().invoke(app, [*path, "--help"], prog_name="recall-bench", terminal_width=78)


def test_every_command_is_reached():
    names = {" ".join(p) for p in PATHS}
    assert {"run", "demo", "query", "history", "report", "server start", "batch collect"} <= names


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "recall-bench")
def test_help_fits_80_columns(path):
    result = help_of(path)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines and lines[0].startswith("Usage: recall-bench")
    too_wide = [line for line in lines if len(line) > 80]
    assert not too_wide, too_wide
    cut = [line for line in lines if line.rstrip().endswith("...") and not line.startswith("Usage:")]
    assert not cut, f"a short help was cut off: {cut}"
    split = [line for line in lines if re.search(r"--[a-z][a-z-]*-$", line.rstrip())]
    assert not split, f"an option name is split over two lines: {split}"
    assert "<bool>" not in result.output, "a flag shows a type"


def test_the_exit_codes_are_a_table_in_the_top_level_help():
    output = help_of([]).output
    codes = re.findall(r"^\s{2,}(\d+)\s{2,}\S", output, re.M)
    assert codes == ["0", "2", "3", "4", "5", "6", "7", "130"], output
