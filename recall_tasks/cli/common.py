"""What the ``recall-bench`` commands share: the consoles, the common options, one-line errors, the result store.

The helpers keep their leading underscore: they are internal to :mod:`recall_tasks.cli`.
"""

from __future__ import annotations

import os
import traceback
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from recall_tasks._logging import inert
from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError, one_line
from recall_tasks.io.storage import parse_storage_options
from recall_tasks.secrets import looks_secret, redact

# Data is printed as it is: no emoji codes (``doc:100:7`` stays, never ``doc💯7``), and no highlighting on stderr
# (an error line's ids are never cut by colour codes). Markup is only ever recall-bench's own: data goes through
# ``plain`` (escaped) or is printed with ``markup=False`` or as ``rich.text.Text``.
console = Console(emoji=False)
err = Console(stderr=True, soft_wrap=True, emoji=False, highlight=False)

DEFAULT_OUTPUT = RunParams.model_fields["output_uri"].default
"""Every command's ``--output`` default, unless the ``RECALL_OUTPUT`` environment variable is set."""

# Options shared by the commands that read or write an output: one default and one help text everywhere.
OutputOption = Annotated[
    str,
    typer.Option(
        "--output", "-o", envvar="RECALL_OUTPUT", help="Where the tables live: a path or s3://, gs://, az:// URI"
    ),
]
FormatOption = Annotated[
    str | None,
    typer.Option(
        "--format",
        help="delta | parquet | iceberg; default: what is at --output already, else delta (one output holds "
        "one format: another one is refused)",
    ),
]
StorageOption = Annotated[
    list[str] | None,
    typer.Option("--storage-option", help="key=value for the object store (repeatable); secrets go to AWS_* vars"),
]
OutputFormatOption = Annotated[
    str, typer.Option("--output-format", help="table | csv | json (JSON lines, one object per row) | markdown")
]
RawCellsOption = Annotated[
    bool,
    typer.Option(
        "--raw-cells",
        help="csv: keep text cells starting with = + - @ (formula-like) exactly, for programs, not spreadsheets "
        "(default: such a cell gets a ' in front, so a spreadsheet shows it as text and runs nothing)",
    ),
]


DEBUG_HELP = "Show Prefect's logs and full tracebacks"


_SECRET_ENV = {
    "aws_access_key_id": "AWS_ACCESS_KEY_ID",
    "access_key_id": "AWS_ACCESS_KEY_ID",
    "key": "AWS_ACCESS_KEY_ID",
    "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "secret": "AWS_SECRET_ACCESS_KEY",
    "aws_session_token": "AWS_SESSION_TOKEN",
    "token": "AWS_SESSION_TOKEN",
}


def _split_storage_options(pairs: list[str]) -> dict[str, str]:
    """Non-secret options become run parameters; credentials go to this process's AWS_* variables only."""
    plain: dict[str, str] = {}
    for key, value in parse_storage_options(pairs).items():
        if looks_secret(key):
            env = _SECRET_ENV.get(key.lower())
            if env is None:
                raise typer.BadParameter(f"--storage-option {key}: unknown credential option; use AWS_* variables")
            os.environ[env] = value  # written for the storage clients and settings.settings() to read
        else:
            plain[key] = value
    return plain


def plain(value: object) -> str:
    """``value`` for a Rich markup string: redacted, its control characters shown escaped (``\\x1b``: a dataset's
    escape sequence never reaches the terminal raw), its markup escaped."""
    return escape(inert(redact(str(value))))


def _fail(exc: BaseException, debug: bool = False, code: int = 2) -> NoReturn:
    """One line, ``error: …``, exit ``code`` (2); ``--debug`` prints the (redacted) traceback before it."""
    if debug and exc.__traceback__ is not None:
        err.print(plain("".join(traceback.format_exception(exc))), soft_wrap=True, highlight=False)
    err.print("[bold red]error:[/]", plain(exc), soft_wrap=True)
    raise typer.Exit(code=code)


def _fail_unexpected(exc: Exception, debug: bool) -> NoReturn:
    """An exception recall-bench did not raise on purpose (a bug, a library's error): still one line."""
    text = one_line(exc, 500, empty="(no message)")
    hint = "" if debug else " (rerun with --debug for the traceback)"
    message = RuntimeError(f"{type(exc).__name__}: {text}{hint}")
    message.__traceback__ = exc.__traceback__
    _fail(message, debug)


def _detect_format(output: str, storage_option: list[str] | None, storage: Any = None) -> str:
    """``--format`` when not given: what the tables already at ``output`` are (see results.detect_format)."""
    from recall_tasks.io.results import detect_format
    from recall_tasks.io.storage import StorageConfig

    if storage is None:
        storage = StorageConfig.from_options(_split_storage_options(storage_option or []))
    return detect_format(output, storage)


def _store(output: str, format: str | None, storage_option: list[str] | None, *, writes: bool = False) -> Any:
    """The result store at ``output``; ``format`` None: detected from the tables already there. A ``format``
    other than the one already at ``output`` is refused (one output, one format: results.check_format);
    ``writes`` (maintain): an output holding two formats too, whatever is asked."""
    from recall_tasks.io.results import ResultStore, check_format
    from recall_tasks.io.storage import StorageConfig

    storage = StorageConfig.from_options(_split_storage_options(storage_option or []))
    if format is None:
        format = _detect_format(output, storage_option, storage)
    elif format not in ("delta", "parquet", "iceberg"):
        raise ConfigError(f"--format must be delta, parquet or iceberg, got {format!r}")
    else:
        check_format(output, storage, format, writes=writes)
    return ResultStore(output, storage, format)  # type: ignore[arg-type]
