"""``--max-requests`` and ``--max-cost-usd`` for the whole run when its chunks score in worker processes
(``--task-runner processes|dask``).

The flow creates one Prefect global concurrency limit per budget and run, with no decay: a counter of what the run
reserved (:func:`create_counters`). ``recall-bench-requests-<run id>`` has ``--max-requests`` slots, one per judge
request; ``recall-bench-cost-<run id>`` has ``--max-cost-usd`` in micro-dollars. A resumed attempt of the run (same
run id) finds them and takes from them: the budget holds per run, not per attempt (what a worker held unspent
when its process was stopped counts as spent). Micro-dollars because a limit's slots are an integer that Prefect
stores in a 32-bit column (``INTEGER`` on Postgres): a millionth of a dollar is finer than one call of the cheapest
priced model (a few hundred tokens of gpt-4.1-nano, tens of micro-dollars) and still fits budgets up to 2147.48
USD (larger ones are refused, as is a request budget above 2**31 - 1). Costs are rounded up to a whole
micro-dollar, so the counter never under-counts.

Each worker's :class:`FleetBudget` holds one :class:`Share` per counter: grants of a fiftieth of the budget (a
request share at most 100 requests; at least one slot, or what one attempt needs) taken by incrementing the
counter, spent locally as :class:`~recall_tasks.fleet.guards.Budget` spends its own: a judge call reserves its
first request; each HTTP attempt after the first reserves another before it is sent, and with a cost budget each
attempt reserves its worst case (prompt bytes plus completion limit at the price) before it is sent and gives back
what its reply did not use. A reservation the worker's shares cannot cover takes another grant; an increment the
counter cannot hold is refused (423): the worker reads what is left and takes it; once that does not cover the
attempt, it waits while its own attempts in flight hold reservations, and then its budget is exhausted (``request
budget reached (--max-requests N, the whole run)`` / ``cost budget reached (--max-cost-usd X, the whole run)``):
the attempt is not sent, the reason travels back in the chunk report and the run ends ``budget_exhausted``. What a
worker still holds unspent when its last chunk in flight ends goes back to the counter. The flow deletes the
counters when the run is committed.

Bounds. The run's requests are at most ``--max-requests`` and its cost at most ``--max-cost-usd``, whatever is in
flight. Under-use: what other workers hold (a grant each, and their reservations in flight) when one stops; a
worker never waits for another's. A call without a price (``cost_usd`` None: a failed call) is charged nothing,
as the threads path charges it; a model of no known price is refused with ``--max-cost-usd`` before the run
(``checks.check_priced``, ``--price``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError
from recall_tasks.fleet import rate as fleet
from recall_tasks.fleet.guards import Budget, Call

log = logging.getLogger(__name__)

REQUESTS, COST = "requests", "cost"
NOUNS = {REQUESTS: "request", COST: "cost"}
#: Slots of the cost counter per US dollar: micro-dollars (see the module's docstring).
UNITS_PER_USD = 1_000_000
#: The largest limit Prefect stores (a 32-bit integer column on Postgres).
MAX_SLOTS = 2**31 - 1


def cost_units(usd: float) -> int:
    """``usd`` in the cost counter's micro-dollars, rounded up (a charge never counts less than was spent)."""
    return max(math.ceil(usd * UNITS_PER_USD - 1e-6), 0)


def counter_sizes(max_requests: int | None, max_cost_usd: float | None) -> dict[str, int]:
    """The slots of each run-wide counter a run's budget asks for, by kind (a cost budget rounded down)."""
    sizes = {}
    if max_requests:
        sizes[REQUESTS] = max_requests
    if max_cost_usd:
        sizes[COST] = max(math.floor(max_cost_usd * UNITS_PER_USD + 1e-6), 1)
    return sizes


def _option(kind: str, max_requests: int | None, max_cost_usd: float | None) -> str:
    return f"--max-requests {max_requests}" if kind == REQUESTS else f"--max-cost-usd {max_cost_usd:g}"


def budget_options(max_requests: int | None, max_cost_usd: float | None) -> str:
    """``--max-requests`` / ``--max-cost-usd``: the budget options set, for error texts."""
    kinds = counter_sizes(max_requests, max_cost_usd)
    return " / ".join(_option(kind, max_requests, max_cost_usd).split()[0] for kind in kinds)


def counters_spent(run_id: str) -> tuple[int, float]:
    """What the run's counters hold (reserved by its attempts on worker processes): (requests, USD); zeros when
    there is no Prefect API or no counter (a resumed threads attempt starts from them and its files)."""
    if fleet.api_url() is None:
        return 0, 0.0
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    held = {REQUESTS: 0, COST: 0}
    try:
        with get_client(sync_client=True) as client:
            for kind in held:
                with contextlib.suppress(ObjectNotFound):
                    limit = client.read_global_concurrency_limit_by_name(f"{fleet.PREFIX}-{kind}-{run_id}")
                    held[kind] = limit.active_slots
    except Exception as exc:  # noqa: BLE001 - one line naming the API's host: the run cannot know what it spent
        raise ConfigError(
            f"cannot read what the interrupted run spent from the Prefect API at {fleet.host(fleet.api_url() or '')}"
            f" ({fleet.reason(exc)})"
        ) from None
    return held[REQUESTS], held[COST] / UNITS_PER_USD


def create_counters(params: RunParams, run_id: str, spent: tuple[int, float] = (0, 0.0)) -> dict[str, str]:
    """The run attempt's counters (processes/dask with a budget), created now: their names by kind; {} otherwise.
    ``spent``: what the run reserved before (an attempt on threads wrote it to its ledger files): a counter holding
    less is raised to it, so a resume on another runner keeps the run's spend."""
    sizes = counter_sizes(params.max_requests, params.max_cost_usd)
    if params.task_runner == "threads" or not sizes:
        return {}
    for kind, slots in sizes.items():
        if slots > MAX_SLOTS:
            what = "micro-dollars" if kind == COST else "requests"
            raise ConfigError(
                f"{_option(kind, params.max_requests, params.max_cost_usd)} with --task-runner {params.task_runner}:"
                f" the run's counter in Prefect holds at most {MAX_SLOTS} {what}"
            )
    url = fleet.api_url()
    option = budget_options(params.max_requests, params.max_cost_usd)
    if url is None:
        raise ConfigError(
            f"{option} with --task-runner {params.task_runner} is counted by a Prefect server, and this process "
            "has no Prefect API (PREFECT_API_URL)"
        )
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    names: dict[str, str] = {}
    for kind, slots in sizes.items():
        name = f"{fleet.PREFIX}-{kind}-{run_id}"  # a resumed attempt takes from its earlier attempts' counter
        try:
            with get_client(sync_client=True) as client:
                try:
                    client.read_global_concurrency_limit_by_name(name)
                    log.info("the run's %s counter %s holds its earlier attempts' spend", NOUNS[kind], name)
                except ObjectNotFound:
                    with contextlib.suppress(ObjectAlreadyExists):  # another attempt created it meanwhile
                        client.create_global_concurrency_limit(
                            GlobalConcurrencyLimitCreate(name=name, limit=slots, slot_decay_per_second=0.0)
                        )
                want = min(spent[0] if kind == REQUESTS else cost_units(spent[1]), slots)
                held = client.read_global_concurrency_limit_by_name(name).active_slots
                if want > held:  # the run's earlier spend on threads, counted as taken
                    client.increment_concurrency_slots(names=[name], slots=want - held, mode="concurrency")
        except Exception as exc:  # noqa: BLE001 - one line naming the counter and the API's host
            delete_counters(names.values())
            raise ConfigError(
                f"{_option(kind, params.max_requests, params.max_cost_usd)}: the Prefect API at {fleet.host(url)} "
                f"refused the run's {NOUNS[kind]} counter {name} ({fleet.reason(exc)})"
            ) from None
        names[kind] = name
    return names


def delete_counters(names: Iterable[str]) -> None:
    """The run is committed: its counters go (a failure is a warning, never the run's outcome)."""
    for name in names:
        try:
            from prefect.client.orchestration import get_client

            with get_client(sync_client=True) as client:
                client.delete_global_concurrency_limit_by_name(name)
        except Exception as exc:  # noqa: BLE001 - clean-up only
            log.warning("could not delete the run's counter %s: %s", name, fleet.reason(exc))


@dataclass
class Share:
    """This process's share of one run-wide counter: slots granted and not spent yet (negative: owed)."""

    kind: str  # REQUESTS or COST
    name: str
    slots: int  # the counter's limit
    option: str  # "--max-requests 25", for reasons and errors
    grant: int
    allowance: int = 0
    acquires: int = 0

    @property
    def exhausted(self) -> str:
        return f"{NOUNS[self.kind]} budget reached ({self.option}, the whole run)"

    def charge(self, requests: int, cost_usd: float | None) -> int:
        """What a call that returned charges beyond its reservation (a request share reserved its first request)."""
        if self.kind == REQUESTS:
            return max(requests - 1, 0)
        return cost_units(cost_usd) if cost_usd else 0


class FleetBudget(Budget):
    """A worker's share of the run's ``--max-requests`` and ``--max-cost-usd``, taken from the run's counters."""

    def __init__(
        self,
        counters: Mapping[str, str],
        api: str,
        *,
        max_requests: int | None = None,
        max_cost_usd: float | None = None,
        max_in_flight: int | None = None,
    ) -> None:
        super().__init__(max_cost_usd=max_cost_usd, max_in_flight=max_in_flight)
        sizes = counter_sizes(max_requests, max_cost_usd)
        if set(counters) != set(sizes):
            raise ConfigError(f"the run's budget counters {sorted(counters)} do not match its budget {sorted(sizes)}")
        self.api = api
        self.shares = [
            Share(
                kind,
                counters[kind],
                slots,
                _option(kind, max_requests, max_cost_usd),
                grant=max(1, min(100, slots // 50) if kind == REQUESTS else slots // 50),
            )  # fmt: skip
            for kind, slots in sizes.items()
        ]
        self._lock: asyncio.Lock | None = None
        self._clients: fleet._Clients = weakref.WeakKeyDictionary()

    def share(self, kind: str) -> Share | None:
        return next((s for s in self.shares if s.kind == kind), None)

    def acquire(self, call: Call | None = None) -> bool:
        raise RuntimeError("a FleetBudget is reserved with `await reserve()`")

    async def _reserve(self, call: Call | None = None) -> bool:
        if call is not None and call.gated:  # its attempts reserve as they are sent
            if self.exhausted_reason is not None:
                return False
            self.in_flight += 1
            return True
        for share in self.shares:
            if self.exhausted_reason is None and share.allowance < 1 and not await self._take_locked(share, 1):
                self.exhausted_reason = share.exhausted
        if self.exhausted_reason is not None or any(share.allowance < 1 for share in self.shares):
            return False
        for share in self.shares:
            if share.kind == REQUESTS:
                share.allowance -= 1  # an ungated call's first request; the rest is charged when it returns
        self.in_flight += 1
        self.requests += 1
        return True

    async def _take_locked(self, share: Share, need: int) -> bool:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            return share.allowance >= need or await self._take(share, need)

    def _charge(self, requests: int, cost_usd: float) -> None:
        super()._charge(requests, cost_usd)
        for share in self.shares:
            share.allowance -= share.charge(requests + 1, cost_usd)

    async def _reserve_attempt(self, call: Call) -> None:
        self._settle(call, 0.0)  # an earlier attempt of this completion failed: it bills nothing
        requests, cost = self.share(REQUESTS), self.share(COST)
        if requests is not None:
            if requests.allowance < 1 and not await self._take_locked(requests, 1):
                raise self._stop(requests.exhausted)
            requests.allowance -= 1
        if cost is None:
            return
        need = cost_units(call.worst)
        while cost.allowance < need:
            if await self._take_locked(cost, need):
                continue
            if not self.holding:  # no attempt of this process holds a reservation it could give back
                if requests is not None:
                    requests.allowance += 1  # not sent
                raise self._stop(cost.exhausted)
            await self._changes()
        cost.allowance -= need
        call.held_units += need
        self._hold(call, call.worst)

    def _settle(self, call: Call, cost_usd: float, *, spent: bool = False) -> None:
        cost = self.share(COST)
        if cost is not None and call.held_units:
            cost.allowance += 0 if spent else call.held_units - cost_units(cost_usd)
        elif cost is not None and cost_usd:
            cost.allowance -= cost_units(cost_usd)  # reserved nothing (an attempt of no known worst case)
        call.held_units = 0
        super()._settle(call, cost_usd, spent=spent)

    async def _take(self, share: Share, need: int = 1) -> bool:
        """One grant for ``share`` (and its debt, and ``need``), or what is left of the counter; False when what
        the counter had left does not cover ``need``."""
        import httpx

        client = await fleet._loop_client(self._clients, self.api)
        rest: int | None = None  # what the counter had left when it refused a grant
        try:
            while True:
                # computed each round: calls returning during the awaits below charge more debt meanwhile
                want = min(max(share.grant, need - share.allowance), share.slots)  # never more than the limit (422)
                if rest is not None:
                    want = min(want, rest)
                try:
                    await client.increment_concurrency_slots(names=[share.name], slots=want, mode="concurrency")
                except httpx.HTTPStatusError as exc:
                    if exc.response.status_code != 423:
                        raise
                    current = await client.read_global_concurrency_limit_by_name(share.name)
                    rest = current.limit - current.active_slots
                    if rest <= 0:
                        return False
                    continue
                share.allowance += want
                share.acquires += 1
                if share.allowance >= need:
                    return True
                if rest is not None:  # took the rest, and it does not cover the debt
                    return False
        except Exception as exc:  # noqa: BLE001 - one line naming the counter
            raise ConfigError(
                f"{share.option.split()[0]}: the run's {NOUNS[share.kind]} counter {share.name} could not be read "
                f"or taken from ({fleet.reason(exc)})"
            ) from None

    async def give_back(self) -> None:
        """Return what this process holds unspent to the counters (its last chunk in flight ended).

        The loop's client stays open: on a Dask worker another chunk may start on the same loop at once and take
        a grant with it (closing it here stopped that chunk's run). :meth:`aclose` closes it with the plan.
        """
        for share in self.shares:
            held, share.allowance = max(share.allowance, 0), min(share.allowance, 0)
            if not held:
                continue
            try:
                client = await fleet._loop_client(self._clients, self.api)
                await client.request(
                    "POST", "/v2/concurrency_limits/decrement", json={"names": [share.name], "slots": held}
                )
            except Exception as exc:  # noqa: BLE001 - the slots are lost to the run, nothing worse
                log.warning(
                    "could not return %d %s to the run's counter %s: %s",
                    held, "requests" if share.kind == REQUESTS else "micro-dollars", share.name, fleet.reason(exc),
                )  # fmt: skip

    async def aclose(self) -> None:
        """Close this loop's API client (the worker's plan is closed)."""
        await fleet._close_loop_client(self._clients)
