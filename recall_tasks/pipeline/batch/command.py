"""The run ``recall-bench batch collect`` finishes and the judge ``batch cancel`` calls: the record is state, the
command is configuration.

A record lives in the output (``<output>/_batches/*.json``), which whoever can write to a shared bucket can write
too. So a record never decides where requests go or what code runs:

- **From the command** (:class:`Command`): the endpoint (``--base-url``, else ``OPENAI_BASE_URL``, else OpenAI's),
  the key (``OPENAI_API_KEY``, as for ``run``), the storage settings, ``--batch-fallback``.
- **Never in a record**: a ``module:function`` (``retriever``, ``context_extractor``) or a record that is not a
  ``--batch`` run's (``batch`` not true): refused, as collecting must never become a live run of someone else's
  making.
- **From the record, validated** (``RunParams.model_validate``, never ``model_copy(update=...)``): what the run is
  (dataset, metric, model, thresholds...). Where it disagrees with the command (``base_url``, the recorded
  ``endpoint``, ``storage_options``) the command is refused in one line naming the field, before any call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError
from recall_tasks.judges._openai_http import endpoint_host
from recall_tasks.settings import settings

#: Fields naming code to import and run: a record holding one is refused.
CODE_FIELDS = ("retriever", "context_extractor")


@dataclass(frozen=True)
class Command:
    """What ``batch collect`` / ``batch cancel`` were given: ``base_url`` (``--base-url``; None: the environment's
    ``OPENAI_BASE_URL`` or OpenAI's), the non-secret ``storage_options``, ``batch_fallback`` (None: as recorded)."""

    base_url: str | None = None
    storage_options: dict[str, str] = field(default_factory=dict)
    batch_fallback: str | None = None


def _endpoint(url: str | None) -> str:
    """The endpoint a judge given ``url`` calls (``OPENAI_BASE_URL`` when None, as ``OpenAIJudge`` resolves it)."""
    resolved = url or settings().openai_base_url or "https://api.openai.com/v1"
    return resolved.rstrip("/")


def _refuse(path: str, name: str, detail: str) -> ConfigError:
    return ConfigError(f"the batch record {path} is refused: field {name}: {detail}")


def run_params(record: dict[str, Any], path: str, command: Command) -> RunParams:
    """The parameters of the run the record's batches belong to, as this command may run it (see the module
    docstring): ConfigError naming the field when the record sets code, is not a ``--batch`` run's, disagrees
    with the command or does not validate."""
    stored = record.get("params")
    if not isinstance(stored, dict):
        raise ConfigError(
            f"the batch record {path} does not hold the run parameters (written before recall-bench recorded them): "
            "rerun the original `recall-bench run ... --batch` command to collect it"
        )
    if stored.get("batch") is not True:
        raise _refuse(
            path, "batch", f"{stored.get('batch')!r}: a record is a --batch run's; collecting never runs live"
        )
    for name in CODE_FIELDS:
        if stored.get(name):
            raise _refuse(path, name, "a record never says which code to run (pass it to `run` yourself)")
    ours, theirs = _endpoint(command.base_url), _endpoint(stored.get("base_url"))
    if ours != theirs:
        where = "--base-url" if command.base_url else "OPENAI_BASE_URL" if settings().openai_base_url else "OpenAI's"
        raise _refuse(path, "base_url", f"submitted to {theirs}, this command's endpoint ({where}) is {ours}")
    if record.get("endpoint") is not None and record.get("endpoint") != endpoint_host(ours):
        raise _refuse(path, "endpoint", f"{record.get('endpoint')}, this command's endpoint is {endpoint_host(ours)}")
    if (stored.get("storage_options") or {}) != command.storage_options:
        raise _refuse(path, "storage_options", "they differ from this command's --storage-option (give the same)")
    fallback = command.batch_fallback or record.get("batch_fallback") or stored.get("batch_fallback") or "error"
    data = {**stored, "batch_wait": False, "batch_collect_only": True, "batch_fallback": fallback}
    try:
        return RunParams.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = ".".join(map(str, first["loc"])) or "params"
        raise _refuse(path, name, str(first["msg"]).removeprefix("Value error, ")) from None
