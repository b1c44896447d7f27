"""The environment variables recall-bench reads, in one pydantic-settings model; nothing else reads ``os.environ``.

Use :func:`settings` (``settings().openai_base_url``); the table in docs/usage.md ("Environment variables") is
:func:`environment_table`, checked by ``tests/test_settings.py``.

Decisions:
- Every field names its variable with an explicit ``validation_alias`` and the match is case-sensitive, as a
  direct ``os.environ`` lookup was: ``OPENAI_API_KEY`` is read, ``openai_api_key`` is not. pydantic-settings'
  ``env_prefix`` is not used: with case-sensitive names it appends the field name as written
  (``RECALL_BENCH_state_dir``), so the project's own ``RECALL_BENCH_*`` names are spelt out like the others.
- An empty variable counts as unset (``env_ignore_empty``), as the ``os.environ.get(name) or default`` reads it
  replaced did; of two names for one setting (``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``) the first
  one set wins.
- Keys and credentials are :class:`~pydantic.SecretStr`: a printed or logged ``Settings`` shows ``**********``.
  Their names are ``secrets.SECRET_ENV_VARS``, which redaction reads from the live environment.
- Values stay strings where a caller gives a better error than pydantic would (``RECALL_BENCH_SERVER_PORT``:
  ``cli/server.default_port`` names the variable; ``AWS_ALLOW_HTTP``: ``StorageConfig`` validates it): reading
  the settings never fails, so a bad port cannot break a command that does not start a server.
- Read once per environment: :func:`settings` validates when one of the variables below changed since the last
  call (it compares their values, a dozen dict lookups) and otherwise returns the same frozen object. So a test's
  ``monkeypatch.setenv``, and the command line's own exports (``--storage-option`` credentials,
  ``cli/common.py``), are seen by the next call without a cache reset; :func:`cache_clear` drops the cache.
- Not here: variables that Prefect reads itself (``PREFECT_API_URL``: the command line sets it for a run's
  length, ``cli/runtime.py``, and probes it as Prefect will see it), the environment handed to the local
  server's process (``cli/server.py``), and ``RECALL_OUTPUT``, read by the ``--output`` option (Typer).
  ``tests/test_settings.py`` lists every other ``os.environ`` use in the package with its reason.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "ENV_NAMES", "READ_ELSEWHERE", "Settings", "cache_clear", "env_names", "environment_table", "settings", "state_dir",
]  # fmt: skip


class Settings(BaseSettings):
    """recall-bench's environment. Field descriptions are the table in docs/usage.md (:func:`environment_table`)."""

    model_config = SettingsConfigDict(case_sensitive=True, env_ignore_empty=True, extra="ignore", frozen=True)

    openai_api_key: SecretStr | None = Field(
        None, validation_alias="OPENAI_API_KEY", description="API key of the `openai` judge"
    )
    openai_base_url: str | None = Field(
        None,
        validation_alias="OPENAI_BASE_URL",
        description="OpenAI-compatible endpoint (vLLM, Ollama...) when `--base-url` is not given; default OpenAI",
    )
    azure_openai_endpoint: str | None = Field(
        None, validation_alias="AZURE_OPENAI_ENDPOINT", description="Azure OpenAI endpoint (`OpenAIJudge.azure`)"
    )
    azure_openai_api_key: SecretStr | None = Field(
        None, validation_alias="AZURE_OPENAI_API_KEY", description="Azure OpenAI API key (`OpenAIJudge.azure`)"
    )
    openai_api_version: str = Field(
        "2024-10-21", validation_alias="OPENAI_API_VERSION", description="Azure OpenAI API version; default 2024-10-21"
    )
    aws_access_key_id: SecretStr | None = Field(
        None, validation_alias="AWS_ACCESS_KEY_ID", description="Object storage access key id"
    )
    aws_secret_access_key: SecretStr | None = Field(
        None, validation_alias="AWS_SECRET_ACCESS_KEY", description="Object storage secret key"
    )
    aws_session_token: SecretStr | None = Field(
        None, validation_alias="AWS_SESSION_TOKEN", description="Object storage session token"
    )
    aws_endpoint_url: str | None = Field(
        None,
        validation_alias=AliasChoices("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
        description="S3-compatible endpoint (MinIO, SeaweedFS...); default AWS",
    )
    aws_region: str | None = Field(
        None, validation_alias=AliasChoices("AWS_REGION", "AWS_DEFAULT_REGION"), description="Object storage region"
    )
    aws_allow_http: str | None = Field(
        None, validation_alias="AWS_ALLOW_HTTP", description="`true`: allow a plain-http endpoint"
    )
    state_dir: str | None = Field(
        None,
        validation_alias="RECALL_BENCH_STATE_DIR",
        description="The local state directory (the local Prefect server's state; the row cache's spill while the "
        "output is unreachable; `evaluate()`'s private copies of in-memory data, `inputs/`); default "
        "`$XDG_STATE_HOME/recall-bench`",
    )
    xdg_state_home: str | None = Field(
        None,
        validation_alias="XDG_STATE_HOME",
        description="Base of the default state directory; default `~/.local/state`",
    )
    server_port: str | None = Field(
        None, validation_alias="RECALL_BENCH_SERVER_PORT", description="The local Prefect server's port; default 4250"
    )
    report_link_s: str | None = Field(
        None,
        validation_alias="RECALL_BENCH_REPORT_LINK_S",
        description="Seconds a presigned HTTPS link to a run's HTML report on object storage stays valid, in the "
        "Prefect artifacts (1 to 604800); unset: no presigned link, the artifacts hold the storage URI",
    )
    lease_s: str | None = Field(
        None,
        validation_alias="RECALL_BENCH_LEASE_S",
        description="Seconds a run attempt's lease holds without renewal (renewed every third of it while the "
        "attempt runs): a crashed attempt on another host blocks the same command that long; default 60",
    )
    allow_callables: str | None = Field(
        None,
        validation_alias="RECALL_BENCH_ALLOW_CALLABLES",
        description="A worker's leave: `module:function` names (comma-separated; `module:*` for a module) a "
        "deployment's flow run may give as `retriever` or `context_extractor`; default none (docs/security.md)",
    )
    allow_endpoints: str | None = Field(
        None,
        validation_alias="RECALL_BENCH_ALLOW_ENDPOINTS",
        description="A worker's leave: URL prefixes (comma-separated) a deployment's flow run may give as "
        "`base_url`, a storage `endpoint_url` or `dask_address`, besides the worker's own `OPENAI_BASE_URL` and "
        "`AWS_ENDPOINT_URL`; default none (docs/security.md)",
    )
    allow_storage: str | None = Field(
        None,
        validation_alias="RECALL_BENCH_ALLOW_STORAGE",
        description="A worker's leave: the storage prefixes (comma-separated: `s3://bucket/prefix`, a local folder, "
        "`s3://` for any bucket) a deployment's flow run may read and write; default any bucket of s3, gs, az "
        "and abfs, and local paths under the worker's working folder (docs/security.md)",
    )
    crash_at: str | None = Field(
        None,
        validation_alias="RECALL_BENCH_CRASH_AT",
        description="Test hook: kill the process at this named point (crash-safety tests)",
    )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Settings:
        """The settings ``environ`` alone holds, by the same names and rules (``tests/test_settings.py``).

        Every field is given (its value, else its default): pydantic-settings fills the fields not given from
        the process environment.
        """
        values: dict[str, Any] = {}
        for field, info in cls.model_fields.items():
            names = env_names(field)
            found = next((environ[name] for name in names if environ.get(name)), None)
            values[names[0]] = info.default if found is None else found
        return cls(**values)


def env_names(field: str) -> tuple[str, ...]:
    """The variable(s) a field is read from, first choice first."""
    alias = Settings.model_fields[field].validation_alias
    if isinstance(alias, str):
        return (alias,)
    assert isinstance(alias, AliasChoices), field  # every field names its variable (module docstring)
    return tuple(str(choice) for choice in alias.choices)


#: Every variable :class:`Settings` reads.
ENV_NAMES: tuple[str, ...] = tuple(name for field in Settings.model_fields for name in env_names(field))

#: Variables recall-bench documents but does not read through :class:`Settings` (see the module docstring).
READ_ELSEWHERE: dict[str, str] = {
    "RECALL_OUTPUT": "Every command's `--output` default; else `recall-output` (read by the option itself)",
    "PREFECT_API_URL": "The Prefect server runs report to (read by Prefect); unset: the local server",
}


@functools.lru_cache(maxsize=8)
def _read(values: tuple[str | None, ...]) -> Settings:
    """``values`` (the variables' values now) is only the cache key: pydantic-settings reads the environment."""
    return Settings()


def settings() -> Settings:
    """The settings of the environment as it is now, validated once per distinct set of values (module docstring)."""
    return _read(tuple(os.environ.get(name) for name in ENV_NAMES))


def state_dir() -> Path:
    """The per-user state directory: ``RECALL_BENCH_STATE_DIR``, else ``$XDG_STATE_HOME/recall-bench``."""
    env = settings()
    if env.state_dir:
        return Path(env.state_dir)
    base = env.xdg_state_home or str(Path.home() / ".local" / "state")
    return Path(base) / "recall-bench"


def cache_clear() -> None:
    """Forget every :class:`Settings` read so far (the next :func:`settings` call reads the environment)."""
    _read.cache_clear()


def environment_table() -> str:
    """The Markdown table of docs/usage.md's "Environment variables" section."""
    rows = ["| Variable | Meaning |", "| --- | --- |"]
    for field, info in Settings.model_fields.items():
        names = ", else ".join(f"`{name}`" for name in env_names(field))
        secret = " (secret: never printed)" if info.annotation == SecretStr | None else ""
        rows.append(f"| {names} | {info.description}{secret} |")
    rows += [f"| `{name}` | {meaning} |" for name, meaning in READ_ELSEWHERE.items()]
    return "\n".join(rows) + "\n"
