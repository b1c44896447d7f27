"""The ``run`` command and ``RunParams`` cannot drift: every field is reachable, with the model's default."""

from __future__ import annotations

import pytest
import typer.main

from recall_tasks.cli.app import app
from recall_tasks.config import RunParams

#: Fields the CLI spells differently on purpose (the test checks they are still reachable).
CONVERTED = {"baseline", "columns", "storage_options", "format", "segment_by", "prices"}

#: ``run`` options that are not a field of the same name and type (the test below checks the rest).
RUN_OPTION_FIELDS = {
    "output": "output_uri", "strict": "strict_mode", "reason": "include_reason", "column": "columns",
    "storage_option": "storage_options", "rpm": "requests_per_minute", "tpm": "tokens_per_minute",
    "dataset_uri": "dataset_uri",
    "wait": "batch_wait", "poll_interval": "poll_interval_s", "batch_timeout": "batch_timeout_s",
    "collect_only": "batch_collect_only", "price": "prices",
}  # fmt: skip


def commands() -> dict:
    """The click commands behind the Typer app (typer may bundle its own click: no isinstance checks)."""
    return typer.main.get_command(app).commands  # type: ignore[attr-defined]


def run_command():
    return commands()["run"]


def test_every_run_parameter_is_a_run_option_with_the_models_default() -> None:
    options = {p.name: p for p in run_command().params if p.name not in ("debug", "dry_run")}  # not parameters
    reached = {RUN_OPTION_FIELDS.get(name, name) for name in options}
    assert reached == set(RunParams.model_fields)
    for name, param in options.items():
        field = RUN_OPTION_FIELDS.get(name, name)
        if field in CONVERTED or field == "dataset_uri":
            continue
        assert param.default == RunParams.model_fields[field].default, name


def test_every_option_of_every_command_has_help() -> None:
    def walk(cmds: dict, prefix: str = ""):
        for name, cmd in cmds.items():
            yield f"{prefix}{name}", cmd
            yield from walk(getattr(cmd, "commands", {}), f"{prefix}{name} ")

    every = dict(walk(commands()))
    assert {"run", "demo", "query", "history", "report", "server start", "server stop"} <= set(every)
    missing = [
        f"{cmd_name} {param.name}"
        for cmd_name, cmd in every.items()
        for param in cmd.params
        if param.param_type_name == "option" and not param.help and param.name != "help"
    ]
    assert not missing, missing


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--rpm", "120"], "requests_per_minute", 120),
        (["--tpm", "90000"], "tokens_per_minute", 90000),
        (["--no-reason"], "include_reason", False),
        (["--max-workers", "2"], "max_workers", 2),
        (["--price", "my-model=0.15,0.6", "--price", "free=0,0"], "prices", {"my-model": (0.15, 0.6), "free": (0, 0)}),
    ],
)
def test_options_reach_the_run_parameters(monkeypatch, tmp_path, argv, field, value) -> None:
    from typer.testing import CliRunner

    from recall_tasks.cli import run_flow

    seen: list[RunParams] = []

    def fake_run(params: RunParams, debug: bool = False) -> dict:
        seen.append(params)
        raise SystemExit(0)

    monkeypatch.setattr(run_flow, "_run", fake_run)
    result = CliRunner().invoke(app, ["run", str(tmp_path / "d.parquet"), "-o", str(tmp_path / "o"), *argv])
    assert result.exit_code == 0, result.output
    assert getattr(seen[0], field) == value


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["my-model"], "expected MODEL=IN,OUT"),
        (["my-model=0.15"], "expected MODEL=IN,OUT"),
        (["=1,2"], "expected MODEL=IN,OUT"),
        (["my-model=a,b"], "expected MODEL=IN,OUT"),
        ({"my-model": (-1.0, 2.0)}, "a price cannot be negative"),
    ],
)
def test_a_malformed_price_is_refused_naming_it(given, message) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        RunParams(dataset_uri="d.parquet", prices=given)
