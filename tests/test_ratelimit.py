"""The grant logic of fleet-wide --rpm/--tpm without a Prefect server: sizing, spending, expiry, keys, refusals.

``tests/test_ratelimit_fleet.py`` runs the real thing (three CLI processes, a Prefect server, the quota-enforcing
fake server).
"""

from __future__ import annotations

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pydantic import ValidationError

from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError
from recall_tasks.fleet import rate as fleet
from recall_tasks.judges import ratelimit
from recall_tasks.judges.openai_judge import OpenAIJudge
from recall_tasks.judges.ratelimit import RateLimiter, fleet_shape, limit_key


class Grants:
    """An in-memory grant source: records what was asked; ``hold`` makes it wait before granting."""

    name = "test-grants"

    def __init__(self, hold: float = 0.0) -> None:
        self.asked: list[int] = []
        self.hold = hold

    async def grant(self, amount: int) -> None:
        self.asked.append(amount)
        if self.hold:
            await asyncio.sleep(self.hold)

    async def aclose(self) -> None:
        self.closed = True


@pytest.mark.parametrize("rpm", [60, 500, 600, 1200, 3500, 10_000, 30_000, 150_000, 2_000_000])
def test_the_shared_limit_keeps_every_short_window_within_the_quota(rpm):
    """Burst + one unspent grant + the decay over the window fit the provider's quota over that window."""
    shape = fleet_shape(rpm)
    quota = rpm / 60
    window = max(ratelimit.WINDOW_S, ratelimit.WINDOW_REQUESTS / quota)
    assert shape.capacity + shape.grant + shape.rate * window <= quota * window + 1e-9
    assert shape.capacity >= shape.grant >= 1 and shape.rate > 0
    assert shape.grant * shape.scale >= ratelimit.SLOTS_PER_GRANT  # whole-slot decay loses < 1 % per grant
    if rpm >= 1200:  # a grant is a quarter of a second's worth; the margin stays near 10 % of the quota
        assert shape.grant == round(quota * ratelimit.GRANT_S)
        assert shape.rate >= 0.88 * quota


def test_acquires_are_grants_not_requests():
    async def go() -> tuple[Grants, RateLimiter]:
        source = Grants()
        limiter = RateLimiter(60_000, source, grant=4)  # the local bucket never waits here
        for _ in range(10):
            await limiter.acquire(1)
        return source, limiter

    source, limiter = asyncio.run(go())
    assert source.asked == [4, 4, 4]  # 10 requests: 3 grants of 4, 2 units left
    assert (limiter.acquires, limiter.granted) == (3, 12)


def test_a_large_amount_takes_several_grants_and_no_source_means_no_grants():
    async def go() -> tuple[Grants, RateLimiter]:
        source = Grants()
        limiter = RateLimiter(600_000, source, grant=100)
        await limiter.acquire(950)  # e.g. a long prompt's estimated tokens
        plain = RateLimiter(600_000)
        await plain.acquire(950)
        return source, plain

    source, plain = asyncio.run(go())
    assert source.asked == [100] * 10 and plain.acquires == 0


def test_an_unspent_balance_expires_after_a_grant_time(monkeypatch):
    monkeypatch.setattr(ratelimit, "GRANT_S", 0.05)

    async def go() -> tuple[Grants, RateLimiter]:
        source = Grants()
        limiter = RateLimiter(60_000, source, grant=10)
        await limiter.acquire(1)
        await asyncio.sleep(0.1)  # 9 units held too long: spending them now could burst into a short window
        await limiter.acquire(1)
        return source, limiter

    source, limiter = asyncio.run(go())
    assert source.asked == [10, 10] and limiter.expired == 9


def test_callers_wait_for_one_grant_at_a_time():
    """Concurrent callers share the grant in flight instead of each asking the (slow) source."""

    async def go() -> Grants:
        source = Grants(hold=0.05)
        limiter = RateLimiter(60_000, source, grant=8)
        await asyncio.gather(*(limiter.acquire(1) for _ in range(16)))
        return source

    assert asyncio.run(go()).asked == [8, 8]  # two asks for 16 callers: the others waited for the grant in flight


def test_the_judge_builds_its_limiters_with_the_shared_sources():
    rpm, tpm = Grants(), Grants()
    judge = OpenAIJudge(base_url="http://127.0.0.1:9/v1", api_key="sk-x", requests_per_minute=600, tokens_per_minute=1)
    judge.share_limits((rpm, 3), (tpm, 7))

    async def go() -> list[RateLimiter]:
        judge._state()
        limiters = judge.rate_limiters()
        await judge.aclose()
        return limiters

    limiters = asyncio.run(go())
    assert [(lim.source, lim.grant) for lim in limiters] == [(rpm, 3), (tpm, 7)]
    assert rpm.closed and tpm.closed  # the judge's aclose closes its sources' clients too


def test_the_default_key_is_a_short_hash_of_endpoint_and_model_without_the_url():
    base = limit_key("https://llm.example.com/v1", "gpt-4o")
    assert len(base) == 12 and int(base, 16) >= 0
    assert base == limit_key("https://LLM.example.com/v1/", "gpt-4o")  # same endpoint spelled differently
    assert base != limit_key("https://llm.example.com/v1", "gpt-4o-mini")
    assert base != limit_key("https://other.example.com/v1", "gpt-4o")
    assert limit_key(None, "gpt-4o") == limit_key("https://api.openai.com/v1", "gpt-4o")
    # a query (which may carry a token) is neither in the key nor does it change it
    assert limit_key("https://llm.example.com/v1?sig=tok-123456", "gpt-4o") == base
    name = fleet.limit_name("rpm", limit_key("https://llm.example.com/v1?sig=tok-123456", "gpt-4o"))
    assert "example" not in name and "tok-" not in name and name.startswith("recall-bench-rpm-")


def test_a_key_that_looks_like_an_api_key_is_refused_without_echoing_it(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "team-secret-value-123")
    for bad in ("sk-proj-abcdef123456", "prefix-team-secret-value-123"):
        with pytest.raises(ValidationError) as info:
            RunParams(dataset_uri="d.parquet", rate_limit_key=bad)
        assert "looks like an API key" in str(info.value) and bad not in str(info.value)
    with pytest.raises(ValidationError):
        RunParams(dataset_uri="d.parquet", rate_limit_key="has spaces")
    assert RunParams(dataset_uri="d.parquet", rate_limit_key="team-gpt4o").rate_limit_key == "team-gpt4o"


def test_without_a_prefect_api_the_limits_stay_per_process(monkeypatch):
    monkeypatch.setattr(fleet, "api_url", lambda: None)
    params = RunParams(dataset_uri="d.parquet", judge="openai", requests_per_minute=600)
    judge = OpenAIJudge(base_url="http://127.0.0.1:9/v1", api_key="sk-x", requests_per_minute=600)
    assert fleet.share_limits(params, judge) == [] and judge._grants == {}
    # nothing to share without --rpm/--tpm, even with an API
    monkeypatch.setattr(fleet, "api_url", lambda: "http://127.0.0.1:9/api")
    assert fleet.share_limits(params.model_copy(update={"requests_per_minute": None}), judge) == []


class _Refuse(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(403)
        self.send_header("content-type", "application/json")
        body = b'{"detail": "forbidden"}'
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.concurrency
def test_a_prefect_api_that_refuses_the_limit_is_one_line_naming_it(monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/api"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-refused-SECRET-0123456789")
    params = RunParams(dataset_uri="d.parquet", judge="openai", requests_per_minute=600)
    judge = OpenAIJudge(base_url="http://127.0.0.1:9/v1", requests_per_minute=600)
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}), pytest.raises(ConfigError) as info:
            fleet.share_limits(params, judge)
    finally:
        server.shutdown()
        server.server_close()
    text = str(info.value)
    assert "\n" not in text and "--rpm 600" in text and "refused the fleet rate limit recall-bench-rpm-" in text
    assert "HTTP 403" in text and "SECRET" not in text


def test_rpm_and_tpm_get_one_limit_each_keyed_by_endpoint_and_model(monkeypatch):
    ensured: list[tuple[str, int, int]] = []
    monkeypatch.setattr(fleet, "api_url", lambda: "http://127.0.0.1:9/api")
    monkeypatch.setattr(fleet, "ensure_limit", lambda name, shape, option, n: ensured.append((name, shape.grant, n)))
    params = RunParams(dataset_uri="d.parquet", judge="openai", requests_per_minute=1200, tokens_per_minute=600_000)
    judge = OpenAIJudge(model="gpt-4o", base_url="http://llm.local/v1", api_key="sk-x", requests_per_minute=1200)
    key = limit_key("http://llm.local/v1", "gpt-4o")
    names = fleet.share_limits(params, judge)
    assert names == [f"recall-bench-rpm-{key}", f"recall-bench-tpm-{key}"]
    assert ensured == [(names[0], 5, 1200), (names[1], 2500, 600_000)]  # a quarter of a second's worth each
    assert {k: (src.name, grant) for k, (src, grant) in judge._grants.items()} == {
        "rpm": (names[0], 5),
        "tpm": (names[1], 2500),
    }
    # an explicit key is shared by every judge of the run, whatever its model
    other = OpenAIJudge(model="gpt-4o-mini", base_url="http://llm.local/v1", api_key="sk-x")
    shared = params.model_copy(update={"rate_limit_key": "team-a", "tokens_per_minute": None})
    assert fleet.share_limits(shared, judge) == fleet.share_limits(shared, other) == ["recall-bench-rpm-team-a"]


class _Counter:
    """A Prefect counter limit without decay, as the API answers it: refuses (423) what does not fit."""

    def __init__(self, limit: int) -> None:
        self.limit, self.active, self.returned = limit, 0, 0

    async def increment_concurrency_slots(self, names: list[str], slots: int, mode: str) -> None:
        import httpx

        assert mode == "concurrency"
        if self.active + slots > self.limit:
            request = httpx.Request("POST", "http://prefect/api/v2/concurrency_limits/increment")
            raise httpx.HTTPStatusError("locked", request=request, response=httpx.Response(423, request=request))
        self.active += slots

    async def read_global_concurrency_limit_by_name(self, name: str):
        return type("Limit", (), {"limit": self.limit, "active_slots": self.active})()

    async def request(self, method: str, path: str, json: dict) -> None:
        self.active -= json["slots"]
        self.returned += json["slots"]


def test_a_fleet_budget_takes_grants_then_the_rest_then_stops(monkeypatch):
    from recall_tasks.fleet import budget as fleet_budget

    counter = _Counter(limit=120)

    async def client(clients, api):
        return counter

    async def close(clients):
        return None

    monkeypatch.setattr(fleet, "_loop_client", client)
    monkeypatch.setattr(fleet, "_close_loop_client", close)
    counters = {"requests": "recall-bench-requests-r"}
    a = fleet_budget.FleetBudget(counters, "http://prefect/api", max_requests=120)
    b = fleet_budget.FleetBudget(counters, "http://prefect/api", max_requests=120)

    async def go() -> tuple[int, int]:
        got_a = got_b = 0
        for _ in range(100):  # grants of 2 (120 // 50)
            if await a.reserve():
                got_a += 1
                a.release(2 if got_a == 1 else 1, None)  # the first call needed a repair: charged
        while await b.reserve():
            got_b += 1
            b.release(1, None)
        return got_a, got_b

    got_a, got_b = asyncio.run(go())
    # a: 100 calls + 1 repair = 101 requests from 51 grants of 2 (one request left); b: the 18 left, then stops
    share = a.shares[0]
    assert share.grant == 2 and (got_a, got_b) == (100, 18)
    assert counter.active == 120 and b.exhausted_reason == "request budget reached (--max-requests 120, the whole run)"
    assert not a.exhausted_reason and share.allowance == 1
    asyncio.run(a.give_back())  # a chunk ends: what a still holds goes back
    assert counter.returned == 1 and counter.active == 119 and share.allowance == 0


def _fake_counters(monkeypatch, **limits: int) -> dict[str, _Counter]:
    counters = {name: _Counter(limit) for name, limit in limits.items()}

    class Client:  # one API, several counters: each call goes to the counter it names
        async def increment_concurrency_slots(self, names: list[str], slots: int, mode: str) -> None:
            await counters[names[0]].increment_concurrency_slots(names, slots, mode)

        async def read_global_concurrency_limit_by_name(self, name: str):
            return await counters[name].read_global_concurrency_limit_by_name(name)

        async def request(self, method: str, path: str, json: dict) -> None:
            await counters[json["names"][0]].request(method, path, json)

    async def client(clients, api):
        return Client()

    async def close(clients):
        return None

    monkeypatch.setattr(fleet, "_loop_client", client)
    monkeypatch.setattr(fleet, "_close_loop_client", close)
    return counters


def test_a_fleet_cost_budget_takes_grants_then_the_rest_then_stops(monkeypatch):
    """--max-cost-usd 0.001 for the run: a counter of 1000 micro-dollars, grants of 20, charged as calls return."""
    from recall_tasks.fleet import budget as fleet_budget

    counter = _fake_counters(monkeypatch, cost=1000)["cost"]
    a = fleet_budget.FleetBudget({"cost": "cost"}, "http://prefect/api", max_cost_usd=0.001)
    b = fleet_budget.FleetBudget({"cost": "cost"}, "http://prefect/api", max_cost_usd=0.001)
    assert fleet_budget.cost_units(0.000025) == 25 and fleet_budget.cost_units(0.0000251) == 26  # rounded up

    async def go() -> tuple[int, int]:
        got_a = got_b = 0
        for _ in range(31):  # 10 micro-dollars a call: two calls per grant
            assert await a.reserve()
            got_a += 1
            a.release(1, 0.00001)
        for _ in range(100):  # 25 a call: grants of 20 cover the debt first, then the 680 left run out
            if not await b.reserve():
                break
            got_b += 1
            b.release(1, 0.000025)
        return got_a, got_b

    got_a, got_b = asyncio.run(go())
    share_a, share_b = a.shares[0], b.shares[0]
    assert share_a.grant == 20 and share_a.acquires == 16 and share_a.allowance == 10  # took 320, spent 310
    # b may start a call while it holds unspent allowance: 27 calls spent 675 of its 680, the 28th went over by
    # 20 (at most one call in flight: sequential here); then nothing was left and b stopped
    assert got_b == 28 and share_b.allowance == 680 - 28 * 25 and counter.active == 1000
    assert b.exhausted_reason == "cost budget reached (--max-cost-usd 0.001, the whole run)"
    assert not a.exhausted_reason and a.cost_usd + b.cost_usd == pytest.approx(0.00101)
    assert not asyncio.run(b.reserve())  # exhausted stays exhausted
    asyncio.run(a.give_back())  # a chunk ends: what a holds unspent goes back, b's debt stays b's
    asyncio.run(b.give_back())
    assert counter.returned == 10 and counter.active == 990 and share_a.allowance == 0 and share_b.allowance == -20


def test_a_fleet_budget_with_both_counters_stops_on_the_first_spent(monkeypatch):
    from recall_tasks.fleet import budget as fleet_budget

    counters = _fake_counters(monkeypatch, requests=5, cost=1_000_000)
    both = {"requests": "requests", "cost": "cost"}
    with pytest.raises(ConfigError, match="do not match"):
        fleet_budget.FleetBudget({"requests": "requests"}, "http://prefect/api", max_requests=5, max_cost_usd=1.0)
    budget = fleet_budget.FleetBudget(both, "http://prefect/api", max_requests=5, max_cost_usd=1.0)

    async def go() -> int:
        calls = 0
        for _ in range(100):
            if not await budget.reserve():
                break
            calls += 1
            budget.release(1, 0.001)
        return calls

    assert asyncio.run(go()) == 5
    assert budget.exhausted_reason == "request budget reached (--max-requests 5, the whole run)"
    asyncio.run(budget.give_back())  # the cost counter gets back what was granted and not spent (20000 - 5000)
    assert counters["requests"].active == 5 and counters["cost"].active == 5000
    # one call costing more than the whole cost budget: the next grant is capped at the limit (never a 422)
    big = fleet_budget.FleetBudget({"cost": "c2"}, "http://prefect/api", max_cost_usd=0.0001)
    counters["c2"] = _Counter(100)

    async def expensive() -> tuple[bool, bool]:
        first = await big.reserve()
        big.release(1, 0.0005)
        return first, await big.reserve()

    assert asyncio.run(expensive()) == (True, False) and counters["c2"].active == 100
    assert big.exhausted_reason == "cost budget reached (--max-cost-usd 0.0001, the whole run)"


@pytest.mark.parametrize("fleet_wide", [False, True])
def test_a_cost_budget_lets_only_max_in_flight_calls_start_before_their_cost_is_known(fleet_wide, monkeypatch):
    """Every row of a chunk starts its task at once; a call's cost is known when it returns. Without turns all
    20 calls below passed the cost check before the first answer: the budget stopped nothing. With
    ``max_in_flight`` 3 at most 3 are in flight, and once the spend reaches the budget the rest are refused."""
    from recall_tasks.fleet import budget as fleet_budget
    from recall_tasks.fleet.guards import Budget

    if fleet_wide:  # a worker's share of the run's cost counter (in micro-dollars), on a stand-in counter
        left = [fleet_budget.cost_units(0.01)]

        class Counter:
            async def increment_concurrency_slots(self, names, slots, mode):  # type: ignore[no-untyped-def]
                import httpx

                if slots > left[0]:
                    request = httpx.Request("POST", "http://prefect/api/v2/concurrency_limits/increment")
                    raise httpx.HTTPStatusError(
                        "locked", request=request, response=httpx.Response(423, request=request)
                    )
                left[0] -= slots

            async def read_global_concurrency_limit_by_name(self, name):  # type: ignore[no-untyped-def]
                limit = fleet_budget.cost_units(0.01)
                return type("Limit", (), {"limit": limit, "active_slots": limit - left[0]})()

        async def client(clients, api):  # type: ignore[no-untyped-def]
            return Counter()

        monkeypatch.setattr(fleet_budget.fleet, "_loop_client", client)
        budget: Budget = fleet_budget.FleetBudget(
            {"cost": "c"}, "http://prefect/api", max_cost_usd=0.01, max_in_flight=3
        )
    else:
        budget = Budget(max_cost_usd=0.01, max_in_flight=3)
    peak = [0]

    async def call() -> bool:
        if not await budget.reserve():
            return False
        peak[0] = max(peak[0], budget.in_flight)
        await asyncio.sleep(0.01)
        budget.release(1, 0.004)
        return True

    async def main() -> list[bool]:
        return await asyncio.gather(*(call() for _ in range(20)))

    made = sum(asyncio.run(main()))
    assert peak[0] <= 3
    assert 3 <= made <= 3 + 3  # the calls that reached 0.01 (three of 0.004), plus at most 3 in flight then
    assert budget.exhausted_reason and "cost budget reached (--max-cost-usd 0.01" in budget.exhausted_reason


def test_a_fleet_cost_share_charged_while_it_takes_a_grant_takes_again_not_exhausted(monkeypatch):
    """A call returning while the worker waits on the counter adds debt meanwhile: the grant asked for then no
    longer covers it, and the worker asks again rather than calling the run's budget spent (it had 2 dollars)."""
    from recall_tasks.fleet import budget as fleet_budget

    taken: list[int] = []

    class Counter:
        async def increment_concurrency_slots(self, names, slots, mode):  # type: ignore[no-untyped-def]
            taken.append(slots)
            if len(taken) == 2:
                await asyncio.sleep(0.05)  # this grant is slow: the other call returns meanwhile

    async def client(clients, api):  # type: ignore[no-untyped-def]
        return Counter()

    monkeypatch.setattr(fleet_budget.fleet, "_loop_client", client)
    budget = fleet_budget.FleetBudget({"cost": "c"}, "http://prefect/api", max_cost_usd=2.0, max_in_flight=2)
    (share,) = budget.shares

    async def main() -> bool:
        assert await budget.reserve()  # first grant, no debt yet
        share.allowance = -fleet_budget.cost_units(0.001)  # a call came back owing a thousand micro-dollars

        async def other_call_returns() -> None:
            await asyncio.sleep(0.01)
            budget.in_flight += 1
            budget.release(1, 0.5)  # half a dollar more, charged while the grant below is on its way

        _, reserved = await asyncio.gather(other_call_returns(), budget.reserve())
        return reserved

    assert asyncio.run(main())
    assert budget.exhausted_reason is None and share.allowance >= 0
    assert len(taken) == 3 and taken[2] == 1_000 + 500_000 - 40_000 + 1  # asked again: the new debt, one to spare


def test_tpm_gets_back_what_a_reply_did_not_use():
    """--tpm charges a request's prompt plus its completion limit before it goes; what the reply did not use goes
    back to the bucket and the minute's window, so the next request does not wait for tokens never used."""

    async def go() -> tuple[float, float]:
        limiter = RateLimiter(6000)  # 100 tokens a second, a bucket of 100
        sent = await limiter.acquire(100)
        limiter.give_back(sent, 80)  # the reply used 20 of the 100 charged
        start = time.monotonic()
        await limiter.acquire(90)  # without the give-back: a 90-token deficit, 0.9 s
        return time.monotonic() - start, limiter._in_window

    waited, in_window = asyncio.run(go())
    assert waited < 0.3 and in_window == pytest.approx(110)
