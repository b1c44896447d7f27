"""Judge capabilities (``recall_tasks.judges.capabilities``): who has which, what the checks do with them, and that a
wrapper judge forwards every capability of the judge it wraps (docs/design.md, "Judge capabilities")."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError
from recall_tasks.judges import capabilities as caps
from recall_tasks.judges.base import Judge, JudgeRequest, JudgeResponse
from recall_tasks.judges.lexical import LexicalJudge
from recall_tasks.judges.openai_judge import OpenAIJudge
from recall_tasks.metrics import ContextCoverage, ContextualRecall
from recall_tasks.metrics.claims import claim_units_of
from recall_tasks.pipeline.batch.finish import BatchServedJudge
from recall_tasks.pipeline.batch.settle import Settled
from recall_tasks.pipeline.checks import check_priced
from recall_tasks.pipeline.components import make_judge

#: every capability protocol a judge may have beyond Judge (the wrapper's own, Prepaid, aside)
CAPABILITIES = [
    caps.Preflighted, caps.Closable, caps.Priced, caps.CostBounded, caps.AttemptGated, caps.SharesLimits,
    caps.Batching,
]  # fmt: skip


def members(protocol: type) -> list[str]:
    """The names a protocol declares (its methods, properties and attributes; not Judge's)."""
    names = {n for n in vars(protocol) if not n.startswith("_")} | set(getattr(protocol, "__annotations__", {}))
    return sorted(names - {"model"})


def _judge(monkeypatch: pytest.MonkeyPatch, **kw: Any) -> Judge:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-capabilities")
    return make_judge(RunParams(dataset_uri="d.parquet", judge="openai", base_url="http://127.0.0.1:9/v1", **kw))


def test_the_openai_judge_has_every_capability_and_the_lexical_judge_none(monkeypatch):
    judge = _judge(monkeypatch)
    assert isinstance(judge, OpenAIJudge) and isinstance(judge, caps.FullJudge)
    assert [p.__name__ for p in CAPABILITIES if not isinstance(judge, p)] == []
    assert [p.__name__ for p in CAPABILITIES if isinstance(LexicalJudge(), p)] == []
    assert not isinstance(judge, caps.Prepaid)  # only a batch's served answers are paid for already
    assert caps.gates_attempts(judge) and not caps.gates_attempts(LexicalJudge())
    assert caps.prices_of(judge)["gpt-4o-mini"] == (0.15, 0.60) and caps.prices_of(LexicalJudge()) == {}
    with pytest.raises(ConfigError, match="--batch needs a judge with a Batch API client"):
        caps.batching(LexicalJudge())


def test_max_cost_usd_refuses_an_unpriced_model_of_the_openai_judge_through_its_prices(monkeypatch):
    """The check reads the judge's prices through the Priced protocol: a judge that stopped being Priced (a renamed
    ``prices``) would let an unpriced model run unbounded, and this test fail."""
    params = {"model": "llama-3-70b", "max_cost_usd": 1.0}
    judge = _judge(monkeypatch, **params)
    with pytest.raises(ConfigError, match=r"--max-cost-usd 1 cannot bound model llama-3-70b: .* --price llama-3-70b"):
        check_priced(RunParams(dataset_uri="d.parquet", judge="openai", **params), judge)
    # its smallest request's worst case (CostBounded) bounds the cap from below
    priced = _judge(monkeypatch, max_cost_usd=1e-9)
    with pytest.raises(ConfigError, match="is below the worst case of one judge request"):
        check_priced(RunParams(dataset_uri="d.parquet", judge="openai", max_cost_usd=1e-9), priced)
    check_priced(RunParams(dataset_uri="d.parquet", max_cost_usd=1e-9), LexicalJudge())  # costs nothing


class _Recording:
    """A judge with every capability, recording each member used (with its arguments)."""

    model = "gpt-4o-mini"
    prompt_version = "v-test"
    gates_attempts = True
    prices = {"gpt-4o-mini": (1.0, 2.0)}
    base_url = "http://127.0.0.1:9/v1"
    endpoint = "127.0.0.1:9"

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def _note(self, name: str, *args: Any) -> str:
        self.calls.append((name, args))
        return f"from live {name}"

    def config(self) -> dict[str, Any]:
        return {"judge": "recording"}

    async def judge(self, request: JudgeRequest) -> JudgeResponse:
        raise AssertionError("not called")

    def preflight(self) -> Any:
        return self._note("preflight")

    async def aclose(self) -> Any:
        return self._note("aclose")

    def least_worst_cost(self) -> Any:
        return self._note("least_worst_cost")

    def share_limits(self, rpm: Any, tpm: Any) -> Any:
        return self._note("share_limits", rpm, tpm)

    def batch_body(self, request: Any) -> Any:
        return self._note("batch_body", request)

    def batch_client(self) -> Any:
        return self._note("batch_client")

    async def finish_batch_reply(self, request: Any, content: Any, finish_reason: Any, batch_usage: Any) -> Any:
        return self._note("finish_batch_reply", request, content, finish_reason, batch_usage)


def _wrappers(live: Any) -> list[Any]:
    """Every wrapper judge of the package around ``live``."""
    return [BatchServedJudge(live, {}, "fp", Settled(), fallback_live=False)]


@pytest.mark.parametrize("protocol", CAPABILITIES, ids=lambda p: p.__name__)
def test_each_wrapper_forwards_the_capabilities_of_the_judge_it_wraps(protocol):
    live = _Recording()
    assert isinstance(live, caps.FullJudge)
    for wrapper in _wrappers(live):
        assert "__getattr__" not in vars(type(wrapper)), "forwarded by name, never by a catch-all hook"
        assert isinstance(wrapper, protocol)
        for name in members(protocol):
            value = getattr(wrapper, name)
            if not callable(value):
                assert value == getattr(live, name), name
                continue
            args = [object() for _ in inspect.signature(value).parameters]
            out = value(*args)
            if inspect.iscoroutine(out):
                out = asyncio.run(out)
            assert live.calls[-1] == (name, tuple(args)), name
            returns = inspect.signature(getattr(protocol, name)).return_annotation
            assert out == (None if returns == "None" else f"from live {name}"), name


def test_the_batch_wrapper_is_prepaid_for_its_served_rows_only():
    request = JudgeRequest(task="contextual_recall", question="q", statements=["s"], evidence=["e"])
    wrapper = _wrappers(_Recording())[0]
    assert isinstance(wrapper, caps.Prepaid) and not wrapper.prepaid(request)


def test_claim_units_are_a_capability_of_contextual_recall_with_claims():
    judge = LexicalJudge()
    assert claim_units_of(ContextualRecall(judge)) is None
    assert claim_units_of(ContextCoverage(judge)) is None
    assert claim_units_of(object()) is None
    extractor = _Extractor()
    units = claim_units_of(ContextualRecall(judge, units="claims", claim_extractor=extractor))
    assert units is not None and units.extractor is extractor


class _Extractor:
    model = "x"
    claims_prompt_version = "c1"

    def claims_config(self) -> dict[str, Any]:
        return {}

    async def extract_claims(self, reference: str, retry: Any = None) -> Any:
        raise AssertionError("not called")
