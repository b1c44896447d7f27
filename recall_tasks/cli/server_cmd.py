"""``recall-bench server start|stop|status``: the local Prefect server (managed by :mod:`recall_tasks.cli.server`).

:mod:`recall_tasks.cli.app` adds ``server_app`` to the ``recall-bench`` app as the ``server`` group.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from recall_tasks.cli.common import _fail, console, err
from recall_tasks.errors import RecallBenchError

server_app = typer.Typer(
    no_args_is_help=True,
    help="Start, stop or check the local Prefect server. Run and demo use it when PREFECT_API_URL is not set.",
    rich_markup_mode=None,
)


def _server_line(info: Any) -> str:
    from recall_tasks.cli import server

    return f"UI {info.ui_url}, API {info.api_url} (pid {info.pid}, state {server.state_dir()})"


@server_app.command("start")
def server_start(
    port: Annotated[
        int | None, typer.Option(help="Port on 127.0.0.1 (default $RECALL_BENCH_SERVER_PORT or 4250)")
    ] = None,
) -> None:
    """Start the local Prefect server in the background.

    A server already running is reported, not started again.
    """
    from recall_tasks.cli import server

    try:
        info, started = server.start(port, on_boot=lambda i: err.print("starting the local Prefect server..."))
    except RecallBenchError as exc:
        _fail(exc)
    console.print(
        f"local Prefect server {'started' if started else 'already running'}: {_server_line(info)}", soft_wrap=True
    )


@server_app.command("status")
def server_status() -> None:
    """Say whether the local Prefect server runs.

    Exit 0 when it runs (with its addresses), 1 when it does not.
    """
    from recall_tasks.cli import server

    current = server.status()
    if os.environ.get("PREFECT_API_URL"):  # live: Prefect's own setting, the one runs will use
        url = os.environ["PREFECT_API_URL"]
        err.print(f"note: PREFECT_API_URL is set ({url}): runs use that server, not this one", markup=False)
    if current.info is None:
        stale = " (removed the record of a server that is gone)" if current.stale_removed else ""
        console.print(f"local Prefect server: stopped{stale}", soft_wrap=True)
        raise typer.Exit(code=1)
    console.print(f"local Prefect server: {current.state}, {_server_line(current.info)}", soft_wrap=True)


@server_app.command("stop")
def server_stop() -> None:
    """Stop the local Prefect server.

    Its database is kept for the next start.
    """
    from recall_tasks.cli import server

    info = server.stop()
    console.print(
        "local Prefect server: not running" if info is None else f"stopped the local Prefect server (pid {info.pid})"
    )
