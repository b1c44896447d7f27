"""``--max-requests`` for the whole run when its chunks score in worker processes (``--task-runner processes|dask``).

The flow creates one Prefect global concurrency limit per run attempt, ``recall-bench-requests-<run id>-<hex>``,
with ``--max-requests`` slots and no decay: a counter of the run's judge requests (:func:`create_counter`). Each
worker's :class:`FleetBudget` takes grants of a fiftieth of the budget (at most 100 requests, at least 1) by
incrementing it, and spends them locally as the threads path spends :class:`~recall_tasks.pipeline.scoring.Budget`:
one reservation per judge call, the requests beyond the first of a call (a repair) charged when it returns. An
increment the counter cannot hold is refused (423): the worker reads what is left, takes that, and once nothing is
left its budget is exhausted; the reason travels back in the chunk report and the run ends ``budget_exhausted``.
What a worker still holds when a chunk ends goes back to the counter. The flow deletes the counter when the run is
committed (an interrupted run's counter stays, harmless: a rerun creates its own).

``--max-cost-usd`` stays refused with these runners: a call's cost is known only after it, so a shared cost counter
would need reservations by estimate and a reconciliation, not built.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import weakref

from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError
from recall_tasks.pipeline import fleet
from recall_tasks.pipeline.scoring import Budget

log = logging.getLogger(__name__)


def create_counter(params: RunParams, run_id: str) -> str | None:
    """The run attempt's request counter (processes/dask with ``--max-requests``), created now; None otherwise."""
    if params.task_runner == "threads" or not params.max_requests:
        return None
    url = fleet.api_url()
    if url is None:
        raise ConfigError(
            f"--max-requests with --task-runner {params.task_runner} is counted by a Prefect server, and this "
            "process has no Prefect API (PREFECT_API_URL)"
        )
    name = f"{fleet.PREFIX}-requests-{run_id}-{secrets.token_hex(3)}"
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    try:
        with get_client(sync_client=True) as client:
            client.create_global_concurrency_limit(
                GlobalConcurrencyLimitCreate(name=name, limit=params.max_requests, slot_decay_per_second=0.0)
            )
    except Exception as exc:  # noqa: BLE001 - one line naming the counter and the API's host
        raise ConfigError(
            f"--max-requests {params.max_requests}: the Prefect API at {fleet.host(url)} refused the run's request "
            f"counter {name} ({fleet.reason(exc)})"
        ) from None
    return name


def delete_counter(name: str | None) -> None:
    """The run is committed: its counter goes (a failure is a warning, never the run's outcome)."""
    if not name:
        return
    try:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            client.delete_global_concurrency_limit_by_name(name)
    except Exception as exc:  # noqa: BLE001 - clean-up only
        log.warning("could not delete the run's request counter %s: %s", name, fleet.reason(exc))


class FleetBudget(Budget):
    """A worker's share of the run's ``--max-requests``, taken from the run's counter in grants."""

    def __init__(self, max_requests: int, name: str, api: str) -> None:
        super().__init__()
        self.run_max = max_requests
        self.name = name
        self.api = api
        self.grant = max(1, min(100, max_requests // 50))
        self.allowance = 0  # requests granted to this process and not reserved yet (negative: owed)
        self.acquires = 0
        self._lock: asyncio.Lock | None = None
        self._clients: fleet._Clients = weakref.WeakKeyDictionary()

    def acquire(self) -> bool:
        raise RuntimeError("a FleetBudget is reserved with `await reserve()`")

    async def reserve(self) -> bool:
        if self.exhausted_reason is None and self.allowance < 1:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                if self.exhausted_reason is None and self.allowance < 1:
                    await self._take()
        if self.exhausted_reason is not None or self.allowance < 1:
            return False
        self.allowance -= 1
        self.in_flight += 1
        return True

    def release(self, requests: int, cost_usd: float | None) -> None:
        super().release(requests, cost_usd)
        self.allowance -= max(requests - 1, 0)  # a call took more requests than its reservation

    async def _take(self) -> None:
        import httpx

        client = await fleet._loop_client(self._clients, self.api)
        want = max(self.grant, 1 - self.allowance)
        try:
            while True:
                try:
                    await client.increment_concurrency_slots(names=[self.name], slots=want, mode="concurrency")
                    self.allowance += want
                    self.acquires += 1
                    return
                except httpx.HTTPStatusError as exc:
                    if exc.response.status_code != 423:
                        raise
                current = await client.read_global_concurrency_limit_by_name(self.name)
                left = current.limit - current.active_slots
                if left < 1 - self.allowance or left <= 0:
                    self.exhausted_reason = f"request budget reached (--max-requests {self.run_max}, the whole run)"
                    return
                want = left if want > left else want
        except Exception as exc:  # noqa: BLE001 - one line naming the counter
            raise ConfigError(
                f"--max-requests: the run's request counter {self.name} could not be read or taken from "
                f"({fleet.reason(exc)})"
            ) from None

    async def give_back(self) -> None:
        """Return what this process holds unreserved to the counter (a chunk ended), close this loop's client."""
        held, self.allowance = max(self.allowance, 0), min(self.allowance, 0)
        try:
            if held:
                client = await fleet._loop_client(self._clients, self.api)
                await client.request(
                    "POST", "/v2/concurrency_limits/decrement", json={"names": [self.name], "slots": held}
                )
        except Exception as exc:  # noqa: BLE001 - the requests are lost to the run, nothing worse
            log.warning("could not return %d requests to the run's counter %s: %s", held, self.name, fleet.reason(exc))
        finally:
            await fleet._close_loop_client(self._clients)
