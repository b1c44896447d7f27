"""What a run has spent of its ``--max-requests`` / ``--max-cost-usd`` across its attempts (threads runner).

A run interrupted (Ctrl-C, a crash) and resumed by the same command keeps its run id; its budget holds for the
run, not per attempt. Each attempt writes what the run has reserved so far, its own attempts' and the earlier
ones', to ``<output>/_pending/<run key>.spent/<attempt>.json`` after every chunk and when it is interrupted:
requests reserved (sent, or in flight) and cost settled plus what attempts in flight still hold (a call cancelled
in flight counts at its worst case: the endpoint may bill it). A resumed attempt starts its budget from the
largest of these; the files go when the run is committed. What an attempt reserved after its last write is lost
to the ledger only when the process dies without the interrupt's clean-up (SIGKILL, a crash): then at most one
chunk's calls.

With worker processes (``--task-runner processes|dask``) the run's counters in Prefect are the ledger: they are
named by the run id, so a resumed attempt takes from the same counters (``fleet/budget.py``).
"""

from __future__ import annotations

import json
import logging
import os
import threading

from recall_tasks.fleet.guards import Budget
from recall_tasks.io.results import ResultStore

log = logging.getLogger(__name__)

#: One write at a time in a process: chunk threads end together and each writes the attempt's file. With one
#: temporary name, one thread's rename took the other's file away ("No such file or directory: ….json.tmp"), and
#: the figure read first could land last; under the lock the last write holds the largest figure.
_writing = threading.Lock()


def _folder(store: ResultStore, run_key: str) -> str:
    return store.path("_pending", f"{run_key}.spent")


def spent(store: ResultStore, run_key: str) -> tuple[int, float]:
    """What the earlier attempts of the run ``run_key`` reserved: (requests, USD); (0, 0.0) if none wrote."""
    folder = _folder(store, run_key)
    requests, cost = 0, 0.0
    try:
        if not store.fs.exists(folder):
            return requests, cost
        for path in store.fs.ls(folder, detail=False):
            if not path.endswith(".json"):
                continue
            with store.fs.open(path, "r") as fh:
                data = json.load(fh)
            requests, cost = max(requests, int(data["requests"])), max(cost, float(data["cost_usd"]))
    except Exception as exc:  # noqa: BLE001 - one line: the run cannot know what it spent, so it does not start
        from recall_tasks.errors import ConfigError

        raise ConfigError(f"cannot read what the interrupted run spent ({folder}): {exc}") from None
    return requests, cost


def record(store: ResultStore, run_key: str, attempt: str, budget: Budget) -> None:
    """Write what the run has reserved so far (this attempt's file, written whole)."""
    if budget.max_requests is None and budget.max_cost_usd is None:
        return
    folder = _folder(store, run_key)
    path = f"{folder}/{attempt}.json"
    with _writing:
        _write(store, folder, path, {"requests": budget.requests, "cost_usd": budget.cost_usd + budget.held_usd})


def _write(store: ResultStore, folder: str, path: str, data: dict[str, float]) -> None:
    try:
        store.fs.makedirs(folder, exist_ok=True)
        if type(store.fs).__name__ == "LocalFileSystem":  # whole or not at all, as an object store's PUT
            tmp = f"{path}.tmp"
            with open(tmp, "w") as fh:
                json.dump(data, fh)
            os.replace(tmp, path)
        else:
            with store.fs.open(path, "w") as fh:
                json.dump(data, fh)
    except Exception as exc:  # noqa: BLE001 - the run goes on; a resume would start from an older figure
        log.warning("could not record what the run spent (%s): %s", folder, exc)


def clear(store: ResultStore, run_key: str) -> None:
    """The run is committed: its ledger goes."""
    folder = _folder(store, run_key)
    try:
        if store.fs.exists(folder):
            store.fs.rm(folder, recursive=True)
    except Exception as exc:  # noqa: BLE001 - clean-up only
        log.warning("could not remove %s: %s", folder, exc)
