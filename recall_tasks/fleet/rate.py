"""``--rpm``/``--tpm`` for the whole fleet: Prefect global concurrency limits behind the judge's grant sources.

Every process, machine and concurrent run whose judge has the same limit key (``--rate-limit-key``, default a short
hash of the endpoint URL and the model: :func:`~recall_tasks.judges.ratelimit.limit_key`) takes its budget from
one Prefect global concurrency limit per quota, ``recall-bench-rpm-<key>`` and ``recall-bench-tpm-<key>``: a
limit with slot decay (a token bucket on the Prefect server). Each acquire is two API round trips (a read, then
the increment), so the judge's limiter acquires *grants* of a quarter of a second's worth
(``ratelimit.fleet_shape``) and spends them locally; the openai SDK's 429 handling stays the safety net.

The limits are created on first use (``plan_run``, ``workers.build_plan``) and updated when a run asks for other
values (the latest run's ``--rpm`` wins, with a warning). Acquires are strict: a limit deleted under a run is a
row error naming it, never a silently unlimited run (Prefect's ``rate_limit(strict=False)`` skips a missing
limit; :class:`PrefectGrants` says why it does not use ``rate_limit``). Without a Prefect API (``prefect`` not
imported, or no ``PREFECT_API_URL``: plain library use, Prefect's temporary per-process server) the limiters are
per process, as before.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError, JudgeTransientError
from recall_tasks.judges.capabilities import SharesLimits
from recall_tasks.judges.ratelimit import FleetShape, fleet_shape, limit_key
from recall_tasks.metrics.claims import claim_units_of
from recall_tasks.secrets import redact

log = logging.getLogger(__name__)

PREFIX = "recall-bench"
#: Jitter after a refused grant, as a share of one grant's decay time (uniform between the two).
RETRY_LOW, RETRY_HIGH = 0.0, 0.25


def limit_name(kind: str, key: str) -> str:
    """``recall-bench-rpm-<key>`` / ``recall-bench-tpm-<key>``."""
    return f"{PREFIX}-{kind}-{key}"


def api_url() -> str | None:
    """The Prefect API this process talks to, or None (Prefect not in use: the limits stay per process)."""
    if "prefect" not in sys.modules:
        return None
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def host(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname or url}{f':{parts.port}' if parts.port else ''}"


def reason(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    text = f"HTTP {status}" if status else (type(exc).__name__ + (f": {exc}" if str(exc) else ""))
    return redact(" ".join(text.split()))[:160]


_Clients = weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]


async def _loop_client(clients: _Clients, api: str) -> Any:
    """A Prefect client on the running loop, pointed at ``api`` (the judge's loop thread has no settings context)."""
    loop = asyncio.get_running_loop()
    client = clients.get(loop)
    if client is None:
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: api}):
            client = get_client()
        await client.__aenter__()
        clients[loop] = client
    return client


async def _close_loop_client(clients: _Clients) -> None:
    client = clients.pop(asyncio.get_running_loop(), None)
    if client is not None:
        await client.__aexit__(None, None, None)


@dataclass(eq=False)  # hashable by identity: kept in a WeakSet
class PrefectGrants:
    """A :class:`~recall_tasks.judges.ratelimit.GrantSource` on one Prefect limit with slot decay.

    One ``POST /v2/concurrency_limits/increment`` (``mode="rate_limit"``) per grant, on a client of the caller's
    loop pointed at the API the run was planned with. Refused increments are what the server handles worst: every
    write resets the limit's decay clock, and a refusal writes (``denied_slots``) without applying the decay, so
    processes polling with increments (Prefect's ``rate_limit`` does, after the server's ``Retry-After``) starve
    the limit. So each grant reads the limit first (its free slots, decayed, without a write), sleeps until the
    grant should fit (plus jitter, so processes do not wake together), and increments only then (a refusal, when
    another process was faster, reads again).
    An answer without the limit (deleted under the run) is an error naming it, never an unlimited request.
    """

    name: str
    shape: FleetShape
    option: str  # "--rpm" or "--tpm", for error texts
    api: str
    acquires: int = 0  # grants this process acquired, and their units
    granted: int = 0
    denied: int = 0  # increments refused (another process was faster)
    waits: int = 0  # reads that said "not yet"
    _clients: _Clients = field(default_factory=weakref.WeakKeyDictionary)

    async def _client(self) -> Any:
        return await _loop_client(self._clients, self.api)

    async def grant(self, amount: int) -> None:
        import httpx

        client = await self._client()
        step = amount / self.shape.rate  # one grant's decay time
        slots, decay = amount * self.shape.scale, self.shape.rate * self.shape.scale
        while True:
            try:  # read first, increment only when the grant should fit: no write resets the decay clock in vain
                current = await client.read_global_concurrency_limit_by_name(self.name)
                short = slots - (current.limit - current.active_slots)
                if short > 0:  # sleep until it should fit, then increment without reading again
                    self.waits += 1
                    await asyncio.sleep(short / decay + step * random.uniform(RETRY_LOW, RETRY_HIGH))
                response = await client.increment_concurrency_slots(names=[self.name], slots=slots, mode="rate_limit")
                if not response.json():
                    raise self._error("the limit does not exist: deleted while the run used it?")
                self.acquires += 1
                self.granted += amount
                return
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code != 423:
                    raise self._error(reason(exc)) from None
                self.denied += 1  # another process took the room first: read again
            except JudgeTransientError:
                raise
            except Exception as exc:  # noqa: BLE001 - unreachable API, deleted limit, timeouts: one line
                raise self._error(reason(exc)) from None

    async def aclose(self) -> None:
        """Close this loop's API client (the judge's ``aclose``)."""
        await _close_loop_client(self._clients)

    def _error(self, why: str) -> JudgeTransientError:
        return JudgeTransientError(f"{self.option}: the fleet rate limit {self.name} granted nothing ({why})")


@dataclass
class _Ensured:
    done: dict[str, tuple[int, float]] = field(default_factory=dict)  # name -> (limit, decay) this process set


_ensured = _Ensured()
_sources: weakref.WeakSet[PrefectGrants] = weakref.WeakSet()  # this process's, for process_stats()


def ensure_limit(name: str, shape: FleetShape, option: str, per_minute: int) -> None:
    """Create the limit if missing; set this run's values if another run left other ones. One-line errors."""
    values = (shape.capacity * shape.scale, round(shape.rate * shape.scale, 6))
    if _ensured.done.get(name) == values:
        return
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    url = api_url() or "?"
    try:
        with get_client(sync_client=True) as client:
            try:
                current: Any = client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                try:
                    client.create_global_concurrency_limit(
                        GlobalConcurrencyLimitCreate(
                            name=name, limit=values[0], slot_decay_per_second=values[1], active=True
                        )
                    )
                    log.info("created the fleet rate limit %s (%s %d)", name, option, per_minute)
                    current = None
                except ObjectAlreadyExists:  # another process created it meanwhile
                    current = client.read_global_concurrency_limit_by_name(name)
            if current is not None and (
                current.limit != values[0]
                or abs(current.slot_decay_per_second - values[1]) > 1e-6
                or not current.active
            ):
                log.warning(
                    "fleet rate limit %s had %d slots decaying %.3f/s%s; set to this run's %s %d",
                    name, current.limit, current.slot_decay_per_second, "" if current.active else " (inactive)",
                    option, per_minute,
                )  # fmt: skip
                client.update_global_concurrency_limit(
                    name,
                    GlobalConcurrencyLimitUpdate(limit=values[0], slot_decay_per_second=values[1], active=True),
                )
    except Exception as exc:  # noqa: BLE001 - any refusal is one line naming the limit and the API's host
        raise ConfigError(
            f"{option} {per_minute}: the Prefect API at {host(url)} refused the fleet rate limit {name} "
            f"({reason(exc)}); use a Prefect API that allows global concurrency limits, or run without {option}"
        ) from None
    _ensured.done[name] = values


def share_limits(params: RunParams, judge: Any) -> list[str]:
    """Give the judge fleet-wide grant sources for ``--rpm``/``--tpm``; returns the limit names (none: local).

    A judge without ``share_limits`` (the lexical judge) or a run without ``--rpm``/``--tpm`` is left alone.
    """
    wanted = [
        (kind, option, per_minute)
        for kind, option, per_minute in (
            ("rpm", "--rpm", params.requests_per_minute),
            ("tpm", "--tpm", params.tokens_per_minute),
        )
        if per_minute
    ]
    if not wanted or not isinstance(judge, SharesLimits):
        return []
    url = api_url()
    if url is None:
        log.info("no Prefect API: %s hold for this process only", " and ".join(o for _, o, _ in wanted))
        return []
    key = params.rate_limit_key or limit_key(judge.base_url, judge.model)
    sources: dict[str, tuple[PrefectGrants, int]] = {}
    for kind, option, per_minute in wanted:
        shape = fleet_shape(per_minute)
        name = limit_name(kind, key)
        ensure_limit(name, shape, option, per_minute)
        source = PrefectGrants(name, shape, option, url)
        _sources.add(source)
        sources[kind] = (source, shape.grant)
    judge.share_limits(sources.get("rpm"), sources.get("tpm"))
    return [source.name for source, _ in sources.values()]


def run_judges(metric: Any) -> list[Any]:
    """The judges a metric calls: its judge, and the claim extractor of ``--units claims`` if it is another one."""
    judges: list[Any] = [metric.judge]
    units = claim_units_of(metric)
    if units is not None and units.extractor is not metric.judge:
        judges.append(units.extractor)
    return judges


def share_run_limits(params: RunParams, metric: Any) -> None:
    """Fleet-wide ``--rpm``/``--tpm`` for every judge of the run's metric (``plan_run``, ``workers.build_plan``)."""
    for judge in run_judges(metric):
        names = share_limits(params, judge)
        if names:
            log.info("judge %s: rate limits shared fleet-wide through Prefect (%s)", judge.model, ", ".join(names))


def process_stats() -> list[dict[str, Any]]:
    """What this process's grant sources did, per limit: grants acquired, units granted, refusals, waits."""
    out: dict[str, dict[str, Any]] = {}
    for source in list(_sources):
        row = out.setdefault(source.name, {"limit": source.name, "acquires": 0, "granted": 0, "denied": 0, "waits": 0})
        for k in ("acquires", "granted", "denied", "waits"):
            row[k] += getattr(source, k)
    return list(out.values())
