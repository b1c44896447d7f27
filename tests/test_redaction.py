"""Redaction masks secrets, never ordinary words (issue 39, item 4): a local stand-in for a key (LocalStack's
``test``, vLLM's ``EMPTY``) no longer rewrites the data, a real key is still masked wherever it shows, and a
listing that masked something says so."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from recall_tasks.cli.app import app
from recall_tasks.secrets import redact, redactor, register_secret, secret_like

STAND_INS = ["test", "EMPTY", "minioadmin", "placeholder", "changeme", "password", "localstack", "test-key", "AKIACFG1"]
KEYS = [
    "sk-proj-Zx81kQ0aPwL3bN7c",  # OpenAI
    "sk-lean-0123456789",
    "AKIAIOSFODNN7EXAMPLE",  # AWS access key id
    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",  # AWS secret access key
    "ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",  # GitHub
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",  # JWT
    "9f86d081884c7d659a2feaa0c55ad015",  # 32 hex
    "rbsecret0a1b2c3d4e5f",  # the test S3 server's shape
]
STAND_IN_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "OPENAI_API_KEY": "EMPTY"}
SQL = "SELECT 'test' AS dataset, 'q_test_1' AS row_id, 'EMPTY answer, a test of the password' AS reason"


@pytest.mark.parametrize("value", STAND_INS)
def test_an_ordinary_word_is_no_secret(value: str) -> None:
    assert not secret_like(value)


@pytest.mark.parametrize("value", KEYS)
def test_a_key_looks_like_one(value: str) -> None:
    assert secret_like(value)


def test_stand_in_keys_leave_the_data_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in STAND_IN_ENV.items():
        monkeypatch.setenv(name, value)
    register_secret("password")  # a secret that is a common word: never registered
    text = "dataset=test row q_test_1: EMPTY answer (password reset)"
    assert redact(text) == text
    mask = redactor()
    assert mask(text) == text and mask.masked == 0


def test_a_real_key_is_still_masked_whole_beside_a_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    key = "sk-proj-Zx81kQ0aPwL3bN7c"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("OPENAI_API_KEY", key)
    assert redact(f"test row failed: Bearer {key} refused; Authorization:{key}x") == (
        "test row failed: Bearer *** refused; Authorization:***x"
    )
    mask = redactor()
    assert [mask(v) for v in (f"key={key}", "test", key)] == ["key=***", "test", "***"]
    assert mask.masked == 2


def test_query_keeps_the_words_of_a_stand_in_key() -> None:
    result = CliRunner().invoke(app, ["query", SQL, "--output-format", "csv"], env=STAND_IN_ENV)
    assert result.exit_code == 0, result.output
    assert result.stdout == 'dataset,row_id,reason\ntest,q_test_1,"EMPTY answer, a test of the password"\n'
    assert result.stderr == ""


@pytest.mark.parametrize("fmt", ["table", "csv", "json", "markdown"])
def test_query_says_when_it_masked_a_key(fmt: str) -> None:
    key = "sk-proj-Zx81kQ0aPwL3bN7c"
    sql = f"SELECT 'test' AS dataset, 'key={key}' AS leaked, '{key}' AS again"
    env = {**STAND_IN_ENV, "OPENAI_API_KEY": key}
    result = CliRunner().invoke(app, ["query", sql, "--output-format", fmt], env=env)
    assert result.exit_code == 0, result.output
    assert key not in result.output and "key=***" in result.stdout and "test" in result.stdout
    assert result.stderr == "2 values held a secret, shown as ***\n"
