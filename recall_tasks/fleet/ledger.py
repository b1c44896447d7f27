"""What a run has spent of its ``--max-requests`` / ``--max-cost-usd`` across its attempts (threads runner).

A run interrupted (Ctrl-C, a crash) and resumed by the same command keeps its run id; its budget holds for the
run, not per attempt. Each attempt writes what the run has reserved so far, its own attempts' and the earlier
ones', to ``<output>/_pending/<run key>.spent/<attempt>.json`` after every chunk and when it is interrupted
(:func:`recall_tasks.io.conditional.update`: written whole, and the last write holds the latest figure):
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

from recall_tasks.fleet.guards import Budget
from recall_tasks.io import conditional
from recall_tasks.io.results import ResultStore

log = logging.getLogger(__name__)


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
            data = json.loads(store.fs.cat_file(path))
            requests, cost = max(requests, int(data["requests"])), max(cost, float(data["cost_usd"]))
    except Exception as exc:  # noqa: BLE001 - one line: the run cannot know what it spent, so it does not start
        from recall_tasks.errors import ConfigError

        raise ConfigError(f"cannot read what the interrupted run spent ({folder}): {exc}") from None
    return requests, cost


def record(store: ResultStore, run_key: str, attempt: str, budget: Budget) -> None:
    """Write what the run has reserved so far over this attempt's file, at the version read. Chunk threads end
    together and race for the file: each reads the budget after the file, so the write that lands last read the
    budget last, and a thread that lost to another reads both again."""
    if budget.max_requests is None and budget.max_cost_usd is None:
        return
    folder = _folder(store, run_key)

    def reserved(_: bytes | None) -> bytes:
        return json.dumps({"requests": budget.requests, "cost_usd": budget.cost_usd + budget.held_usd}).encode()

    try:
        conditional.update(store.fs, f"{folder}/{attempt}.json", reserved)
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
