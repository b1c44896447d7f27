"""The environment is read in one place (recall_tasks/settings.py), and the table in docs/usage.md is that place's."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import click
import pytest
import typer

from recall_tasks import settings as settings_module
from recall_tasks.secrets import SECRET_ENV_VARS, redact
from recall_tasks.settings import ENV_NAMES, READ_ELSEWHERE, Settings, env_names, environment_table, settings

ROOT = Path(__file__).resolve().parents[1]

#: Every other use of the process environment, by (module, function), and why it is not a setting.
LIVE_ENVIRONMENT = {
    ("recall_tasks.secrets", "_known_secrets"): "redaction masks the secrets the environment holds at that moment",
    ("recall_tasks.cli.server_cmd", "server_status"): "PREFECT_API_URL, Prefect's own setting",
    ("recall_tasks.cli.server", "configured_api_url"): "PREFECT_API_URL, Prefect's own setting",
    ("recall_tasks.cli.server", "_server_env"): "the environment handed to the server's process",
    ("recall_tasks.cli.runtime", "_prefect_api"): "sets and restores PREFECT_API_URL for Prefect",
    ("recall_tasks.cli.common", "_split_storage_options"): "writes --storage-option credentials to AWS_*",
    ("recall_tasks.cli.app", "settle_process"): "the recall-bench process's own allocator and runtime settings",
}


NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def environment_uses(path: Path) -> set[str]:
    """The functions of ``path`` (``<module>`` at top level) that touch ``os.environ``/``os.getenv``/``putenv``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else where
            if isinstance(child, ast.Attribute) and child.attr in NAMES and ast.unparse(child.value) == "os":
                found.add(where)
            if isinstance(child, ast.ImportFrom) and child.module == "os" and {a.name for a in child.names} & NAMES:
                found.add(inner)
            visit(child, inner)

    visit(tree, "<module>")
    return found


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_only_settings_reads_the_environment_and_the_rest_is_listed_with_its_reason() -> None:
    sources = [*sorted((ROOT / "recall_tasks").rglob("*.py")), *sorted((ROOT / "flows").rglob("*.py"))]
    uses = {(module_name(p), fn) for p in sources for fn in environment_uses(p)}
    uses = {use for use in uses if use[0] != "recall_tasks.settings"}
    assert uses == set(LIVE_ENVIRONMENT), (
        f"read through recall_tasks.settings instead, or list with a reason: {sorted(uses - set(LIVE_ENVIRONMENT))}; "
        f"listed but gone: {sorted(set(LIVE_ENVIRONMENT) - uses)}"
    )


def test_the_checker_finds_each_way_of_reading_the_environment(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os\nfrom os import getenv\nA = os.environ.get('X')\n"
        "def f():\n    return os.getenv('Y')\n"
        "def g():\n    from os import environ\n"
        "def h():\n    os.environ['Z'] = '1'\n"
        "def clean():\n    return os.path.join('a', 'b')\n"
    )
    assert environment_uses(probe) == {"<module>", "f", "g", "h"}


def test_every_secret_setting_is_redacted_and_never_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    secret_fields = [f for f, info in Settings.model_fields.items() if "SecretStr" in str(info.annotation)]
    assert {name for f in secret_fields for name in env_names(f)} == set(SECRET_ENV_VARS)
    for name in SECRET_ENV_VARS:
        monkeypatch.setenv(name, f"value-of-{name.lower()}")
    shown = f"{settings()} {settings()!r} {settings().model_dump()} {settings().model_dump_json()}"
    assert "value-of-" not in shown
    assert redact(f"got {os.environ['OPENAI_API_KEY']}") == "got ***"


def test_settings_follow_the_environment_by_its_exact_names(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    first = settings()
    assert settings() is first  # nothing changed: not read again
    assert first.openai_base_url is None and first.openai_api_version == "2024-10-21"
    monkeypatch.setenv("openai_base_url", "http://lower-case:1")  # not the variable's name: not read
    assert settings().openai_base_url is None
    monkeypatch.setenv("OPENAI_BASE_URL", "http://judge:8000/v1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "")  # empty counts as unset: the next name is read
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://s3:9000")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "default-region")
    monkeypatch.setenv("AWS_REGION", "region")
    monkeypatch.setenv("RECALL_BENCH_SERVER_PORT", "not-a-port")  # a string: cli/server names the variable
    now = settings()
    assert now is not first
    assert (now.openai_base_url, now.aws_endpoint_url) == ("http://judge:8000/v1", "http://s3:9000")
    assert now.aws_region == "region"
    assert now.server_port == "not-a-port"
    settings_module.cache_clear()
    assert settings() == now and settings() is not now


def test_from_environ_reads_a_mapping_as_the_environment_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every name of every field, set one at a time: ``Settings.from_environ`` and the real source agree."""
    monkeypatch.setenv("OPENAI_BASE_URL", "http://from-the-process:1")  # not in the mapping: not read
    assert Settings.from_environ({}) == Settings.model_construct()  # the defaults
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    for field in Settings.model_fields:
        for name in env_names(field):
            value = f"{name.lower()}-value"
            with monkeypatch.context() as m:
                m.setenv(name, value)
                real = settings()
                assert real == Settings.from_environ({name: value, "UNRELATED": "x"})
                got = getattr(real, field)
                assert (got.get_secret_value() if hasattr(got, "get_secret_value") else got) == value


def test_the_documented_table_is_the_settings_table() -> None:
    usage = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    assert environment_table() in usage, f"docs/usage.md's environment table should read:\n{environment_table()}"
    assert usage.count("| Variable | Meaning |") == 1


def test_every_environment_variable_of_the_command_line_is_in_the_table() -> None:
    from recall_tasks.cli.app import app

    envvars: set[str] = set()

    def walk(command: click.Command) -> None:
        for param in command.params:
            names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or [])
            envvars.update(names)
        for sub in getattr(command, "commands", {}).values():
            walk(sub)

    walk(typer.main.get_command(app))
    assert "RECALL_OUTPUT" in envvars
    assert envvars <= set(READ_ELSEWHERE) | set(ENV_NAMES)
