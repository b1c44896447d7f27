"""``recall-bench batch``: ``status`` (the records as last seen, no provider call), ``collect`` (check once and
finish the run as the rerun of its ``run --batch`` command would) and ``cancel`` (cancel the recorded batches at the
provider). What ``run --batch`` prints while its batches are pending is :mod:`recall_tasks.cli.outcome`."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from recall_tasks.secrets import redact

batch_app = typer.Typer(
    no_args_is_help=True, help="The Batch API runs under an output (run --batch).", rich_markup_mode=None
)


OutputOption = Annotated[
    str, typer.Option("--output", "-o", envvar="RECALL_OUTPUT", help="Where the tables and _batches/ live")
]
StorageOption = Annotated[
    list[str] | None, typer.Option("--storage-option", help="key=value for the object store (repeatable)")
]
RunKeyArgument = Annotated[
    str | None, typer.Argument(help="The run key of the record (see batch status); default: the only pending one")
]


def _stdout() -> Console:
    """Made when printing (the streams of the moment); no emoji codes in data (cli.common's consoles)."""
    return Console(emoji=False)


def _stderr() -> Console:
    """Error lines: no emoji codes, no highlighting inside the data (cli.common's ``err``)."""
    return Console(stderr=True, soft_wrap=True, emoji=False, highlight=False)


def _records(output: str, storage_option: list[str] | None) -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    """The filesystem and the records under ``output``; an unreadable output: one error line, exit 2."""
    from recall_tasks.io.storage import StorageConfig, filesystem, parse_storage_options
    from recall_tasks.pipeline.batch.record import records

    try:
        fs, root = filesystem(output, StorageConfig.from_options(parse_storage_options(storage_option or [])))
        return fs, records(fs, root)
    except Exception as exc:  # noqa: BLE001 - one line, as every command
        _stderr().print(f"error: cannot read {escape(output)}/_batches: {escape(redact(str(exc)))}")
        raise typer.Exit(code=2) from None


def _say(console: Console, line: str) -> None:
    console.print(escape(redact(line)), soft_wrap=True, highlight=False)


@batch_app.command("status")
def status(output: OutputOption = "recall-output", storage_option: StorageOption = None) -> None:
    """List the batches recorded under --output.

    As last seen: no provider call (batch collect checks and collects).
    """
    console = _stdout()
    _, found = _records(output, storage_option)
    if not found:
        console.print(f"no batches recorded under {escape(output)}", highlight=False)
        return
    for _, record in found:
        failures = len(record.get("failures") or {})
        head = f"run {record.get('run_id')} (key {record.get('run_key')}): {record.get('status')}, "
        head += f"submitted {record.get('submitted_at')}"
        if record.get("collected_at"):
            head += f", collected {record['collected_at']} ({failures} failed line(s))"
        if record.get("cancelled_at"):
            head += f", cancelled {record['cancelled_at']}"
        _say(console, head)
        for part in record.get("parts") or []:
            batch_id, count = part.get("batch_id") or "(not created)", len(part["custom_ids"])
            again = " (resubmitted lines)" if part.get("round", 1) > 1 else ""
            _say(console, f"  {batch_id}  {part.get('status')}  {count} request(s){again}")


def _open_record(output: str, storage_option: list[str] | None, run_key: str | None) -> tuple[Any, str, dict[str, Any]]:
    """The pending record collect/cancel act on; none: a message and exit 0; a wrong or ambiguous key: exit 2."""
    from recall_tasks.errors import ConfigError
    from recall_tasks.pipeline.batch.record import choose_open

    fs, found = _records(output, storage_option)
    try:
        path, record = choose_open(found, output, run_key)
    except LookupError as exc:
        _say(_stdout(), str(exc))
        raise typer.Exit(code=0) from None
    except ConfigError as exc:
        _stderr().print("[bold red]error:[/]", escape(redact(str(exc))), soft_wrap=True)
        raise typer.Exit(code=2) from None
    return fs, path, record


BaseUrlOption = Annotated[
    str | None,
    typer.Option(
        "--base-url", help="The judge endpoint the batches were submitted to; default OPENAI_BASE_URL, else OpenAI's"
    ),
]


def _command_params(
    path: str,
    record: dict[str, Any],
    output: str,
    base_url: str | None,
    storage_option: list[str] | None,
    fallback: str | None = None,
) -> Any:
    """The run's parameters from the record's state and this command's endpoint, key, storage settings and
    fallback (``pipeline/batch/command.py``); a refused record or another output location: one line, exit 2."""
    from recall_tasks.cli.common import _split_storage_options
    from recall_tasks.errors import ConfigError
    from recall_tasks.io.storage import StorageConfig, filesystem
    from recall_tasks.pipeline.batch.command import Command, run_params

    try:
        plain = _split_storage_options(storage_option or [])  # credentials reach this process's AWS_* variables
        params = run_params(record, path, Command(base_url, plain, fallback))
        _, root = filesystem(params.output_uri, StorageConfig.from_options(params.storage_options))
        if f"{root.rstrip('/')}/_batches/{record.get('run_key')}.json" != path:
            raise ConfigError(
                f"the batches under {output} were submitted with --output {params.output_uri}, which is another "
                "location from here: run `batch collect` from the directory the run was submitted from"
            )
    except ConfigError as exc:
        _stderr().print("[bold red]error:[/]", escape(redact(str(exc))), soft_wrap=True)
        raise typer.Exit(code=2) from None
    return params


@batch_app.command("collect")
def collect(
    run_key: RunKeyArgument = None,
    output: OutputOption = "recall-output",
    storage_option: StorageOption = None,
    base_url: BaseUrlOption = None,
    batch_fallback: Annotated[
        str | None,
        typer.Option(
            "--batch-fallback",
            help="Failed, expired or cancelled lines: error (resubmitted once, then row errors) | live (judged with "
            "live calls); default: as the run was submitted",
        ),
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show Prefect's logs and full tracebacks")] = False,
) -> None:
    """Check the pending batches once; finish the run if all ended.

    The run finishes exactly as the rerun of its ``run --batch`` command would: what the run is comes from the
    record, where requests go (endpoint, key, storage) from this command, and a record that disagrees is refused.
    Exit codes as ``run``.
    """
    from recall_tasks.cli.run_flow import execute

    if batch_fallback not in (None, "error", "live"):
        raise typer.BadParameter(f"--batch-fallback {batch_fallback}: error | live")
    _, path, record = _open_record(output, storage_option, run_key)
    params = _command_params(path, record, output, base_url, storage_option, batch_fallback)
    execute(params, output, debug, batch_key=record.get("run_key"))


@batch_app.command("cancel")
def cancel(
    run_key: RunKeyArgument = None,
    output: OutputOption = "recall-output",
    storage_option: StorageOption = None,
    base_url: BaseUrlOption = None,
) -> None:
    """Cancel a run's pending batches at the provider.

    Its record is marked cancelled (a later ``run --batch`` submits new batches). The endpoint and key are this
    command's, never the record's.
    """
    from recall_tasks.errors import RecallBenchError
    from recall_tasks.pipeline.batch import record as batch_record

    fs, path, record = _open_record(output, storage_option, run_key)
    params = _command_params(path, record, output, base_url, storage_option)
    try:
        record, cancelled = batch_record.cancel(fs, path, params)
    except RecallBenchError as exc:
        _stderr().print("[bold red]error:[/]", escape(redact(str(exc))), soft_wrap=True)
        raise typer.Exit(code=2) from None
    ids = ", ".join(cancelled) if cancelled else "none was still running"
    _say(_stdout(), f"run {record.get('run_id')} (key {record.get('run_key')}): cancelled; batches cancelled: {ids}")
    _say(_stdout(), "a later `run --batch` with the same parameters submits new batches")
