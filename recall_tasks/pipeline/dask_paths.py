"""Local paths of a run whose chunks go to a Dask cluster elsewhere (``--task-runner dask --dask-address``).

The chunk tasks read the dataset (and ``--retrieval-uri``) and write chunk files, verdicts and Prefect's chunk
cache under the output from the cluster's worker processes, whose working folder is not the user's: a relative
``gold.parquet`` was looked up there and failed after the flow had started (``dataset not found``).

- :func:`absolute`: a relative or ``~`` path of the dataset, output, row cache, retrieval results, canary labels
  or chunk cache storage is made absolute against the folder the run starts in (the CLI's, or the deployment
  worker's for a deployment run), before the run key is derived and anything is shipped. Run by the CLI and by
  the flow (the same parameters either way: absolute paths are left as they are).
- :func:`check_workers_see`: before any judge call, every worker the cluster has checks that it sees each of
  those local paths as this process does: the same file (size, modification time and inode) or, for a folder
  still to be created, the same nearest existing folder (inode). A worker that does not (another machine's disk)
  refuses the run in one ``error:`` line naming the cluster, the worker and the path. A cluster that cannot be
  reached is refused the same way; one with no worker yet is not checked (nothing would run).

URLs (``s3://``, ``gs://``...) are the workers' own business (their credentials) and are not checked.
"""

from __future__ import annotations

import os
from typing import Any

from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError, one_line
from recall_tasks.io.datasets import Dataset
from recall_tasks.io.storage import is_local

#: Parameters that may name a local path read or written by the workers (``canary``: read by the flow, made
#: absolute alike so a deployment's parameters mean the same wherever it runs).
PATH_FIELDS = ("dataset_uri", "output_uri", "cache_uri", "retrieval_uri", "canary")

#: Seconds to connect to the cluster's scheduler for the check.
CONNECT_TIMEOUT_S = 20


def _remote(params: RunParams) -> bool:
    return params.task_runner == "dask" and bool(params.dask_address)


def _local(value: str) -> str | None:
    """The local path ``value`` names (``file://`` or a plain path), else None (a URL, ``block:<slug>``)."""
    if value.startswith("block:") or not is_local(value):
        return None
    return value[len("file://") :] if value.lower().startswith("file://") else value


def absolute(params: RunParams) -> RunParams:
    """``params`` with its relative local paths made absolute when the chunks run on a Dask cluster elsewhere."""
    if not _remote(params):
        return params
    update: dict[str, str] = {}
    for name in PATH_FIELDS:
        value = getattr(params, name)
        path = _local(value) if value else None
        if path is None:
            continue
        full = os.path.abspath(os.path.expanduser(path))
        if full != path:
            update[name] = f"file://{full}" if value.lower().startswith("file://") else full
    return params.model_copy(update=update) if update else params


def signature(path: str) -> tuple[str, str, int, int, int] | None:
    """How ``path`` looks from here: the path itself if it exists, else its nearest existing folder, with kind,
    inode, size and modification time (files only: a folder's size and time change as runs write into it)."""
    seen = os.path.abspath(path)
    while not os.path.exists(seen):
        parent = os.path.dirname(seen)
        if parent == seen:
            return None
        seen = parent
    st = os.stat(seen)
    if os.path.isdir(seen):
        return seen, "folder", st.st_ino, 0, 0
    return seen, "file", st.st_ino, st.st_size, int(st.st_mtime)


def _signatures(paths: list[str]) -> list[tuple[str, str, int, int, int] | None]:
    """Run on each worker by :func:`check_workers_see`."""
    return [signature(p) for p in paths]


def _probes(params: RunParams, dataset: Dataset) -> list[tuple[str, str]]:
    """(what, local path) of everything the workers read or write."""
    probes: list[tuple[str, str]] = []
    for f in dataset.files:
        path = _local(f.uri)
        if path is not None:
            probes.append(("dataset file", os.path.abspath(path)))
    for name, what in (("retrieval_uri", "--retrieval-uri"), ("output_uri", "output"), ("cache_uri", "--cache-uri")):
        value = getattr(params, name)
        path = _local(value) if value else None
        if path is not None:
            probes.append((what, os.path.abspath(path)))
    return probes


def check_workers_see(params: RunParams, dataset: Dataset) -> None:
    """Refuse, before any judge call, a run whose Dask workers do not share this machine's local paths."""
    if not _remote(params):
        return
    probes = _probes(params, dataset)
    if not probes:
        return
    address = str(params.dask_address)
    try:
        from distributed import Client
    except ImportError:
        raise ConfigError("--task-runner dask needs prefect-dask: pip install 'recall-bench[dask]'") from None
    try:
        client: Any = Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)  # type: ignore[no-untyped-call]
    except Exception as exc:  # noqa: BLE001 - OSError, TimeoutError, CommClosedError...
        detail = one_line(exc, 200)
        raise ConfigError(f"--dask-address {address}: cannot reach the Dask cluster: {detail}") from None
    try:
        paths = [p for _, p in probes]
        here = _signatures(paths)
        seen: dict[str, Any] = client.run(_signatures, paths)
    finally:
        client.close()
    for worker, theirs in sorted(seen.items()):
        for (what, path), mine, their in zip(probes, here, theirs, strict=True):
            if mine != their:
                raise ConfigError(
                    f"--dask-address {address}: the Dask cluster's worker {worker} does not see the {what} {path} "
                    f"as this machine does ({_difference(mine, their)}): put the dataset and --output on object "
                    "storage (s3://...) or on a filesystem the workers share at the same path"
                )


def _difference(mine: tuple[str, str, int, int, int] | None, theirs: tuple[str, str, int, int, int] | None) -> str:
    if mine is None or theirs is None or mine[0] != theirs[0]:
        return f"{(mine or ('?',))[0]} does not exist there"
    return f"{mine[0]} is another {mine[1]} there"
