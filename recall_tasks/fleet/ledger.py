"""The run's spend ledger: what a run has reserved of ``--max-requests`` / ``--max-cost-usd`` across its attempts,
held on the store before the requests go out, so the caps hold across a Ctrl-C, a SIGKILL and a rerun.

A run interrupted and resumed by the same command keeps its run id, and its budget holds for the run, not per
attempt. Every HTTP attempt reserves its request (and, under a cost cap, its worst case) from the attempt's
:class:`~recall_tasks.fleet.guards.Budget` before it is sent, and settles when its reply is read. The threads
runner's ledger is ``<output>/_pending/<run key>.spent/<attempt>.json``, next to the run's marker: "the run has
reserved up to N requests and X USD", this attempt's reservations and the earlier attempts' figure it started
from. A resumed attempt starts its budget from the largest figure of the folder (:func:`spent`); the folder goes
when the run is committed (:func:`clear`).

**The block rule.** A write per HTTP attempt would be a PUT per request on S3, too slow with 64 in flight, so
:class:`Ledger` writes ahead in blocks of :data:`BLOCK` of each cap: before an attempt takes the run's reserved
figure above what the attempt's file says, the file is raised to that figure plus a block (``max(1, 5 %)`` of
``--max-requests``, 5 % of ``--max-cost-usd``, never above the cap): about 20 writes per cap and attempt, one at a
time. The attempt waits for the write; attempts within the figure written go on meanwhile, and the next block is
written as soon as half of the current one is reserved, so an attempt rarely waits. A rerun counts what its
earlier attempts' files say as spent, sent or not: conservative, at most a block of each cap is lost to a
SIGKILL, never a request paid twice over the cap. A judge that does not gate its attempts reserves one request per
call and is charged the rest when the call returns; the file covers what was charged at its next call.

**Settling.** When an attempt ends without its commit (an interrupt, an error: its calls have ended) it writes its
exact figure (:func:`record`: requests reserved, cost settled plus what calls cancelled in flight hold), giving the
unused part of its block back to a rerun. A write that fails is a warning and the attempt goes on; a rerun then
starts from the last figure written. The writes are conditional (:func:`recall_tasks.io.conditional.update`):
whole, the last one holds.

With worker processes (``--task-runner processes|dask``) the run's counters in Prefect are the ledger
(``fleet/budget.py``): a worker takes grants from them before it spends, so they hold across a SIGKILL too (what a
killed worker held counts as spent). An attempt on another runner than the earlier one keeps the run's spend: a
resumed threads attempt starts from the larger of the files and the counters, and the counters of a resumed
attempt on worker processes start from what the files say.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math

from recall_tasks.fleet.guards import Budget
from recall_tasks.io import conditional
from recall_tasks.io.results import ResultStore

log = logging.getLogger(__name__)

#: The share of each cap an attempt reserves on the store at a time (see the module's docstring).
BLOCK = 0.05


def _folder(store: ResultStore, run_key: str) -> str:
    return store.path("_pending", f"{run_key}.spent")


def spent(store: ResultStore, run_key: str, run_id: str | None = None) -> tuple[int, float]:
    """What the earlier attempts of the run ``run_key`` reserved: (requests, USD); (0, 0.0) if none wrote.
    ``run_id``: also what the run's counters in Prefect hold (an attempt on worker processes), when there are any."""
    folder = _folder(store, run_key)
    requests, cost = 0, 0.0
    try:
        if store.fs.exists(folder):
            for path in store.fs.ls(folder, detail=False):
                if not path.endswith(".json"):
                    continue
                data = json.loads(store.fs.cat_file(path))
                requests, cost = max(requests, int(data["requests"])), max(cost, float(data["cost_usd"]))
    except Exception as exc:  # noqa: BLE001 - one line: the run cannot know what it spent, so it does not start
        from recall_tasks.errors import ConfigError

        raise ConfigError(f"cannot read what the interrupted run spent ({folder}): {exc}") from None
    if run_id is not None:
        from recall_tasks.fleet import budget as fleet_budget

        counted = fleet_budget.counters_spent(run_id)
        requests, cost = max(requests, counted[0]), max(cost, counted[1])
    return requests, cost


def _write(store: ResultStore, run_key: str, attempt: str, figure: tuple[int, float]) -> None:
    data = json.dumps({"requests": figure[0], "cost_usd": figure[1]}).encode()
    conditional.update(store.fs, f"{_folder(store, run_key)}/{attempt}.json", lambda _: data)


def record(store: ResultStore, run_key: str, attempt: str, budget: Budget) -> None:
    """Write the budget's exact figure over this attempt's file (settling: the attempt's calls have ended). Writers
    racing for the file each read the budget after the file, so the write that lands last read the budget last."""
    if budget.max_requests is None and budget.max_cost_usd is None:
        return
    folder = _folder(store, run_key)

    def reserved(_: bytes | None) -> bytes:
        return json.dumps({"requests": budget.requests, "cost_usd": budget.cost_usd + budget.held_usd}).encode()

    try:
        conditional.update(store.fs, f"{folder}/{attempt}.json", reserved)
    except Exception as exc:  # noqa: BLE001 - the run goes on; a resume would start from an older figure
        log.warning("could not record what the run spent (%s): %s", folder, exc)


class Ledger:
    """One attempt's file of the run's ledger, written ahead in blocks (the module's block rule): the budget's
    :meth:`~recall_tasks.fleet.guards.Budget.reserve` awaits :meth:`cover` before each attempt goes out."""

    def __init__(self, store: ResultStore, run_key: str, attempt: str, budget: Budget) -> None:
        self.store, self.run_key, self.attempt, self.budget = store, run_key, attempt, budget
        self.caps = (budget.max_requests, budget.max_cost_usd)
        self.blocks = (
            max(1, math.ceil(budget.max_requests * BLOCK)) if budget.max_requests else 0,
            budget.max_cost_usd * BLOCK if budget.max_cost_usd else 0.0,
        )
        #: what the store holds for the run: the earlier attempts' figure this attempt started from, then its writes
        self.covered: tuple[int, float] = (budget.requests, budget.cost_usd)
        self.writes = 0
        self._writing: asyncio.Future[None] | None = None
        self._warned = False

    def _short(self, requests: int, cost: float, ahead: bool = False) -> bool:
        """Whether the figure written does not cover ``requests``/``cost`` (``ahead``: with half a block to spare)."""
        (max_requests, max_cost), (block_r, block_c) = self.caps, self.blocks
        spare = 0.5 if ahead else 0.0
        done_r, done_c = self.covered
        if max_requests is not None and done_r < max_requests and requests + spare * block_r > done_r:
            return True
        return max_cost is not None and done_c < max_cost and cost + spare * block_c > done_c + 1e-12

    def _target(self, requests: int, cost: float) -> tuple[int, float]:
        (max_requests, max_cost), (block_r, block_c) = self.caps, self.blocks
        r = requests if max_requests is None else min(max_requests, max(requests, self.covered[0] + block_r))
        c = cost if max_cost is None else min(max_cost, max(cost, self.covered[1] + block_c))
        return max(r, self.covered[0]), max(c, self.covered[1])

    async def cover(self, requests: int, cost: float) -> None:
        """Return once the store says the run reserved at least ``requests`` and ``cost`` (for the caps set)."""
        while self._short(requests, cost):
            if self._writing is None:
                self._start(self._target(requests, cost))
            assert self._writing is not None
            await asyncio.shield(self._writing)
        if self._writing is None and self._short(requests, cost, ahead=True):
            self._start(self._target(requests, cost))  # the next block, while this one is used

    def _start(self, target: tuple[int, float]) -> None:
        async def write() -> None:
            try:
                await asyncio.to_thread(_write, self.store, self.run_key, self.attempt, target)
                self.writes += 1
            except Exception as exc:  # noqa: BLE001 - the run goes on; a rerun starts from the last figure written
                if not self._warned:
                    self._warned = True
                    log.warning("could not record what the run reserved (%s): %s", _folder(self.store, self.run_key),
                                exc)  # fmt: skip
            finally:
                self.covered = (max(self.covered[0], target[0]), max(self.covered[1], target[1]))
                self._writing = None

        self._writing = asyncio.ensure_future(write())

    def settle(self) -> None:
        """The attempt's calls have ended: its file holds its exact figure (the rest of its block goes back)."""
        record(self.store, self.run_key, self.attempt, self.budget)


def clear(store: ResultStore, run_key: str) -> None:
    """The run is committed: its ledger goes."""
    folder = _folder(store, run_key)
    try:
        if store.fs.exists(folder):
            store.fs.rm(folder, recursive=True)
    except Exception as exc:  # noqa: BLE001 - clean-up only
        log.warning("could not remove %s: %s", folder, exc)
