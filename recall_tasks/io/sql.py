"""The read-only SQL behind ``recall-bench query``: DuckDB over the project's tables and nothing else.

Decisions:

* ``enable_external_access=false``: no file, URL or environment access from SQL (``read_text``, ``read_csv``,
  ``glob``, ``COPY … TO``, ``ATTACH``, ``INSTALL``/``LOAD``, replacement scans of Python variables all fail).
  The tables are pyarrow datasets registered with ``con.register``: pyarrow scans them (with the project's
  storage credentials), so they still work with external access off — a test checks it on every table.
* ``lock_configuration=true`` at connect: ``SET``/``PRAGMA`` cannot turn access back on.
* No extension is auto-installed or auto-loaded.
* In-memory scratch (``CREATE TABLE``, temp views) stays allowed: it lives and dies with the process.
"""

from __future__ import annotations

import re
from typing import Any

from recall_tasks.errors import ConfigError

__all__ = ["TABLES", "QueryRefused", "connect_readonly", "explain_error"]

TABLES: tuple[str, ...] = ("results", "runs", "comparisons", "calibrations")

_WRITTEN_WHEN = {
    "results": "it is written when a run is committed",
    "runs": "it is written when a run is committed",
    "comparisons": "it is written when a run is compared with a baseline",
    "calibrations": "it is written by recall-bench calibrate",
}

_CONFIG: dict[str, Any] = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "lock_configuration": True,
}

_MISSING_TABLE = re.compile(r"Table with name (\"?)([A-Za-z_][\w]*)\1 does not exist", re.IGNORECASE)


class QueryRefused(ConfigError):
    """The SQL asked for something the read-only query does not allow (files, COPY, settings, extensions)."""


def connect_readonly(tables: dict[str, Any]) -> Any:
    """A DuckDB connection with ``tables`` (name → pyarrow dataset) registered and everything else locked."""
    import duckdb

    con = duckdb.connect(config=dict(_CONFIG))
    for name, ds in tables.items():
        con.register(name, ds)
    return con


def explain_error(exc: Exception, registered: set[str], output: str) -> ConfigError:
    """A one-line error for a DuckDB failure: missing project tables and refused operations said plainly."""
    import duckdb

    message = " ".join(str(exc).split())
    missing = _MISSING_TABLE.search(message)
    if isinstance(exc, duckdb.CatalogException) and missing:
        name = missing.group(2).lower()
        if name in TABLES and name not in registered:
            return ConfigError(f"no table '{name}' under {output} yet: {_WRITTEN_WHEN[name]}")
    if isinstance(exc, duckdb.PermissionException) or "configuration has been locked" in message:
        return QueryRefused(
            "query refused: it reads only the tables results, runs, comparisons and calibrations "
            f"(files, COPY, ATTACH, settings and extensions are disabled): {message}"
        )
    return ConfigError(f"query failed: {message}")
