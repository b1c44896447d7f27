"""A local Prefect server that recall-bench starts once in the background and reuses: ad-hoc runs start in seconds.

Without ``PREFECT_API_URL``, Prefect boots a temporary ("ephemeral") server inside every process: ~8 s per run
on a quiet machine, and under load it times out (``Timed out while attempting to connect to ephemeral Prefect API
server``). Instead, ``recall-bench run``/``demo`` call :func:`api_url_for_run`:

- ``PREFECT_API_URL`` configured (environment, Prefect profile or ``prefect.toml``): used as is, nothing started;
- otherwise the local server is started if it is not running (the first run pays the boot once, waiting as long
  as the process lives rather than a fixed timeout) and its URL is used for this process only.

Decisions:
- The server is ``python -m prefect server start --host 127.0.0.1 --port PORT`` (UI on), in its own session and
  process group, so the terminal's Ctrl-C or closing it never reaches it; its log is ``server.log``.
- State lives in a per-user directory: ``$RECALL_BENCH_STATE_DIR``, else ``$XDG_STATE_HOME/recall-bench``, else
  ``~/.local/state/recall-bench``: ``server.json`` (pid, port, URLs), ``server.log``, ``prefect/`` (the server's
  ``PREFECT_HOME``: its SQLite database), ``server.lock``. The user's own Prefect home and profiles are untouched.
- Port ``$RECALL_BENCH_SERVER_PORT``, else 4250 (not Prefect's 4200, so a server the user runs there is never
  mistaken for ours). A port held by another process is a clear error naming the way out.
- The UI talks to this server's own API (``PREFECT_SERVER_UI_API_URL``, its ``/ui-settings``), not Prefect's
  default port 4200; the caller's UI API URL settings are not passed on.
- Analytics/telemetry off on the server (``PREFECT_SERVER_ANALYTICS_ENABLED=false``, ``DO_NOT_TRACK=1``): no
  ``Failed to send telemetry`` lines, nothing leaves the machine. Server logging at WARNING (no access log).
- Health is ``GET /api/health`` answering ``true``. A ``server.json`` whose pid is gone (or now another
  program: the command line must mention prefect) is stale: removed and started afresh.
- Start is serialised by an exclusive ``flock`` on ``server.lock``: two runs started at once boot one server.
- Standard library only (no Prefect import): ``status``/``stop`` answer in milliseconds.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from recall_tasks.errors import ConfigError
from recall_tasks.settings import env_names, settings

DEFAULT_PORT = 4250
HOST = "127.0.0.1"
PORT_ENV = env_names("server_port")[0]  # RECALL_BENCH_SERVER_PORT
#: How long ``start`` waits for a booting server before giving up (it keeps waiting while the process lives).
START_TIMEOUT_S = 600.0
STOP_GRACE_S = 10.0


class ServerError(ConfigError):
    """The local Prefect server cannot be started or reached; the message says what to do."""


@dataclass
class ServerInfo:
    """What ``server.json`` records about the running server."""

    pid: int
    port: int
    started_at: str

    @property
    def api_url(self) -> str:
        return f"http://{HOST}:{self.port}/api"

    @property
    def ui_url(self) -> str:
        return f"http://{HOST}:{self.port}"


@dataclass
class Status:
    """``state`` is ``running`` (healthy), ``starting`` (process alive, not answering yet) or ``stopped``."""

    state: str
    info: ServerInfo | None
    stale_removed: bool = False


def state_dir() -> Path:
    """The per-user state directory (created on first use): :func:`recall_tasks.settings.state_dir`."""
    from recall_tasks.settings import state_dir as configured

    return configured()


def default_port() -> int:
    raw = settings().server_port
    if not raw:
        return DEFAULT_PORT
    try:
        port = int(raw)
    except ValueError:
        raise ServerError(f"{PORT_ENV}={raw!r} is not a port number") from None
    if not 0 < port < 65536:
        raise ServerError(f"{PORT_ENV}={raw!r} is not a port number")
    return port


def _info_path() -> Path:
    return state_dir() / "server.json"


def log_path() -> Path:
    return state_dir() / "server.log"


def _read_info() -> ServerInfo | None:
    try:
        raw = json.loads(_info_path().read_text())
        return ServerInfo(pid=int(raw["pid"]), port=int(raw["port"]), started_at=str(raw["started_at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _alive(pid: int) -> bool:
    """The process exists and, where /proc says, is a Prefect server (a recycled pid is not ours)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: not ours
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc (macOS): trust the pid
    if not cmdline:  # a zombie has an empty command line
        return False
    return b"prefect" in cmdline and b"server" in cmdline


def healthy(api_url: str, timeout: float = 2.0) -> bool:
    """Prefect's health endpoint answers ``true``."""
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout) as resp:
            return resp.status == 200 and json.loads(resp.read() or b"null") is True
    except (OSError, urllib.error.URLError, ValueError):
        return False


def unreachable(api_url: str, timeout: float = 5.0) -> str | None:
    """Why nothing answers at ``api_url`` (connection refused, unknown host, timeout), or None if something does.

    Any HTTP answer counts as reachable: a Prefect Cloud workspace URL may answer ``/health`` with 401 or 404.
    """
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as exc:
        return str(exc.reason)
    except (OSError, ValueError) as exc:
        return str(exc) or type(exc).__name__


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    directory = state_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "server.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def status() -> Status:
    """The server's state; a stale ``server.json`` (its process gone) is removed."""
    info = _read_info()
    if info is None:
        return Status("stopped", None)
    if not _alive(info.pid):
        _info_path().unlink(missing_ok=True)
        return Status("stopped", None, stale_removed=True)
    return Status("running" if healthy(info.api_url) else "starting", info)


def _server_env(port: int) -> dict[str, str]:
    """The caller's environment minus its Prefect client and UI API settings, with the server's home, its UI's API
    (this server's own, on ``port``) and analytics off."""
    # the live environment (not settings): the server process inherits all of it, minus the client settings
    dropped = ("PREFECT_API_", "PREFECT_PROFILE", "PREFECT_UI_API_URL", "PREFECT_SERVER_UI_API_URL")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env.update(
        PREFECT_HOME=str(state_dir() / "prefect"),
        # the UI's API: else Prefect's default port (4200), where nothing or another server answers
        PREFECT_SERVER_UI_API_URL=f"http://{HOST}:{port}/api",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        DO_NOT_TRACK="1",
        PREFECT_SERVER_LOGGING_LEVEL="WARNING",
        PREFECT_LOGGING_LEVEL="WARNING",
    )
    return env


def _log_tail(lines: int = 30) -> str:
    try:
        text = log_path().read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def start(
    port: int | None = None, timeout: float = START_TIMEOUT_S, on_boot: Callable[[ServerInfo], None] | None = None
) -> tuple[ServerInfo, bool]:
    """Return the running server, starting it if needed; ``(info, started_by_this_call)``.

    ``on_boot`` is called once when this call boots a server (before waiting for it), for a "starting" message.
    Raises :class:`ServerError` if the port is taken by something else or the server exits while booting.
    """
    with _locked():
        current = status()
        if current.info is not None:
            if port is not None and port != current.info.port:
                raise ServerError(
                    f"the local Prefect server already runs on port {current.info.port}: "
                    "`recall-bench server stop` first to move it"
                )
            _wait_healthy(current.info, None, timeout)
            return current.info, False
        port = default_port() if port is None else port
        if not _port_free(port):
            other = f"http://{HOST}:{port}/api"
            hint = (
                f"a Prefect server answers there: to use it, set PREFECT_API_URL={other}"
                if healthy(other)
                else "another program holds it"
            )
            raise ServerError(
                f"cannot start the local Prefect server: port {port} on {HOST} is in use ({hint}); "
                f"choose another port with {PORT_ENV} or `recall-bench server start --port`"
            )
        directory = state_dir()
        (directory / "prefect").mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", HOST, "--port", str(port)]
        with open(log_path(), "ab") as log:
            log.write(f"\n--- {dt.datetime.now(dt.UTC).isoformat()} {' '.join(cmd)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=_server_env(port),
                cwd=directory, start_new_session=True,
            )  # fmt: skip
        info = ServerInfo(pid=proc.pid, port=port, started_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
        tmp = _info_path().with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(info)))
        os.replace(tmp, _info_path())
        if on_boot is not None:
            on_boot(info)
        try:
            _wait_healthy(info, proc, timeout)
        except BaseException:
            if proc.poll() is not None:
                _info_path().unlink(missing_ok=True)
            raise
        return info, True


def _wait_healthy(info: ServerInfo, proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """Wait until the server answers; fail at once if it exits (with its log), else after ``timeout``."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while not healthy(info.api_url, timeout=2.0):
        exited = proc.poll() is not None if proc is not None else not _alive(info.pid)
        if exited:
            raise ServerError(f"the local Prefect server exited while starting; its log ({log_path()}):\n{_log_tail()}")
        if time.monotonic() > deadline:
            raise ServerError(
                f"the local Prefect server (pid {info.pid}) did not answer {info.api_url}/health within "
                f"{timeout:.0f} s; see {log_path()}, or `recall-bench server stop` and retry"
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def stop(grace: float = STOP_GRACE_S) -> ServerInfo | None:
    """Stop the server (SIGTERM to its process group, SIGKILL after ``grace``); the info of what was stopped."""
    with _locked():
        current = status()
        info = current.info
        if info is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(info.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while _alive(info.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(info.pid, signal.SIGKILL)
        _info_path().unlink(missing_ok=True)
        return info


def configured_api_url() -> str | None:
    """``PREFECT_API_URL`` as Prefect sees it (environment, profile, ``prefect.toml``), or None."""
    url = os.environ.get("PREFECT_API_URL")  # live: Prefect's own setting, which cli/runtime.py sets for a run
    if url:
        return url
    from prefect.settings import get_current_settings

    return get_current_settings().api.url or None


def api_url_for_run(on_boot: Callable[[ServerInfo], None] | None = None) -> tuple[str, bool]:
    """The API a run uses: ``PREFECT_API_URL`` if configured (``(url, False)``), else the local server's.

    ``(url, True)`` means the URL is the local server's and must be applied for this process (it is not in the
    environment or profile).
    """
    url = configured_api_url()
    if url:
        return url, False
    info, _ = start(on_boot=on_boot)
    return info.api_url, True
