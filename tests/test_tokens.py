"""The one token estimate (``judges/tokens.py``): never below a real BPE tokenizer's count, whatever the script, and
the same figure for one request in its five users (the dry run, ``--tpm``, the cost reservation, the ``--batch``
admission, the context-window check)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from deltalake import DeltaTable

from recall_tasks.config import RunParams
from recall_tasks.fleet.guards import Budget
from recall_tasks.judges import context_window, tokens
from recall_tasks.judges.base import JudgeRequest, attempt_gate
from recall_tasks.judges.openai_judge import OpenAIJudge
from recall_tasks.judges.pricing import BATCH_PRICE_FACTOR, price_for
from recall_tasks.judges.ratelimit import RateLimiter
from recall_tasks.pipeline.batch.settle import within_budget
from recall_tasks.pipeline.estimate import estimate
from recall_tasks.pipeline.flow import recall_benchmark
from tests import judge_script
from tests.test_batch import cli, results, runs
from tests.test_pipeline import KEY, write_parquet

#: (text, the most tokens cl100k_base or o200k_base gives it), counted with tiktoken 0.12 on both vocabularies:
#: CJK (common and rare: cl100k gives a rare character 2-3 tokens), other scripts, emoji sequences, digits of
#: several kinds, ids (a random letter string takes up to a token a letter) and English.
REAL_COUNTS = [
    ("hello world", 2), ("The quick brown fox jumps over the lazy dog.", 10), ("internationalization", 2),
    ("東京都", 4), ("龘龘龘", 6), ("䶵䶶䶷䶸", 12), ("你好，世界！这是一个测试。", 12), ("한국어 텍스트입니다", 8),
    ("Привет, мир!", 7), ("مرحبا بالعالم", 10), ("नमस्ते दुनिया", 13), ("สวัสดีชาวโลก", 13), ("🙂", 2),
    ("👩\u200d👩\u200d👧\u200d👦", 18), ("👍🏽👍🏿", 12), ("1234567890", 4), ("3.14159265358979", 7),
    ("٠١٢٣٤٥٦٧٨٩", 20), ("１２３４５", 5), ("²³½Ⅻ", 5), ("550e8400-e29b-41d4-a716-446655440000", 18),
    ("a9f3k2x7qz", 10), ("xkcdqzvw", 6), ("ZXhhbXBsZSBiYXNlNjQ=", 16), ("sk-proj-AbC123xYz", 10), ("doc:100:7", 5),
    ("    indented\n\n\tcode();", 6), ('{"verdicts": [{"id": 1, "chunk_ids": [2]}]}', 19), ("café naïve résumé", 7),
    ("e\u0301\u0301\u0301", 4),
]  # fmt: skip


@pytest.mark.parametrize(("text", "real"), REAL_COUNTS, ids=[repr(t)[:24] for t, _ in REAL_COUNTS])
def test_the_estimate_is_never_below_what_the_tokenizers_count(text: str, real: int) -> None:
    assert real <= tokens.count(text) <= len(text.encode("utf-8"))


def test_the_old_per_script_rule_undercounted_what_the_estimate_covers() -> None:
    """One token a CJK character and one per 6 ASCII letters was below both tokenizers on rare CJK and on ids."""
    assert tokens.count("龘龘龘") == 9 and tokens.count("xkcdqzvw") == 8 and tokens.count("東京都") == 9
    assert tokens.count("hello world") == 2 and tokens.count("1234567") == 3  # known pieces: their count


# -- the five users of a request's tokens --------------------------------------------------------------------------


@pytest.fixture
def judge_env(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    return fake_openai


REQUEST = JudgeRequest(
    task="contextual_recall",
    question="Où est 東京都 ? 2024",
    statements=["東京都は日本の首都です。"],
    evidence=["东京是日本的首都 🙂", "id a9f3k2x7qz"],
)


def test_one_request_has_one_figure_in_all_five_users(prefect_harness, judge_env, tmp_path, monkeypatch) -> None:
    judge = OpenAIJudge(api_key=KEY, base_url=judge_env.base_url, tokens_per_minute=1_000_000)
    figure = judge.tokens_needed(REQUEST)  # the context-window check
    prompt, limit = tokens.request_tokens(judge.batch_body(REQUEST))
    assert figure == prompt + limit and prompt > len(judge.batch_body(REQUEST)["messages"][1]["content"]) // 4
    assert context_window.fit(REQUEST, judge.tokens_needed, figure, "refuse", "m") == (REQUEST, None)
    with pytest.raises(Exception, match=f"need about {figure} tokens"):
        context_window.fit(REQUEST, judge.tokens_needed, figure - 1, "refuse", "m")

    charged: list[float] = []
    acquire = RateLimiter.acquire

    async def spy(self: RateLimiter, amount: float = 1.0) -> Any:
        charged.append(amount)
        return await acquire(self, amount)

    monkeypatch.setattr(RateLimiter, "acquire", spy)
    armed: list[float] = []

    async def call() -> None:
        gate = Budget(max_cost_usd=1.0).call(True)
        arm = gate.arm
        gate.arm = lambda worst: (armed.append(worst), arm(worst))[-1]  # type: ignore[method-assign]
        token = attempt_gate.set(gate)
        try:
            await judge.judge(REQUEST)
        finally:
            attempt_gate.reset(token)
            await judge.aclose()

    asyncio.run(call())
    price = price_for(judge.model, judge.prices)
    assert price is not None
    assert charged == [figure]  # --tpm
    assert armed == [pytest.approx((prompt * price[0] + limit * price[1]) / 1e6)]  # the cost reservation

    line = armed[0] * BATCH_PRICE_FACTOR  # the --batch admission: that bound at the batch price
    plan = SimpleNamespace(params=SimpleNamespace(max_requests=None, max_cost_usd=line * 1.000001),
                           metric=SimpleNamespace(judge=judge))  # fmt: skip
    assert list(within_budget(plan, {"k": REQUEST})) == ["k"]  # type: ignore[arg-type]
    plan.params.max_cost_usd = line * 0.999999
    assert list(within_budget(plan, {"k": REQUEST})) == []  # type: ignore[arg-type]

    row = {"row_id": "r1", "question": REQUEST.question, "ground_truth": REQUEST.statements[0],
           "contexts": list(REQUEST.evidence)}  # fmt: skip
    data = write_parquet(tmp_path / "one.parquet", [row])
    params = RunParams(dataset_uri=data, output_uri=str(tmp_path / "out"), judge="openai", base_url=judge_env.base_url)
    dry = estimate(params)  # the dry run, then the run: the body it sent has the dry run's figure
    recall_benchmark(params)
    sent = judge_env.chat_requests[-1]["body"]
    assert dry.requests == 1 and (dry.prompt_tokens, dry.charged_tokens) == (
        tokens.request_tokens(sent)[0],
        sum(tokens.request_tokens(sent)),
    )


# -- --batch on CJK text: admitted at what it can cost -------------------------------------------------------------

#: CJK characters that cl100k_base and o200k_base give 3 tokens each (no merge of their bytes): the fake's count
RARE_CJK = "䶵䶶䶷䶸䶹䶺䶻䶼䶽䶾䶿"


def _cjk_tokens(text: str) -> int:
    """A tokenizer of the fake that gives these characters 3 tokens each, as cl100k does, ASCII 1 per 4."""
    wide = sum(1 for c in text if not c.isascii())
    return 3 * wide + (len(text) - wide) // 4


def _cjk_rows(n: int) -> list[dict[str, Any]]:
    rng = random.Random(46)
    rows = []
    for i in range(n):
        sentence = "".join(rng.choice(RARE_CJK) for _ in range(60)) + "。"
        other = "".join(rng.choice(RARE_CJK) for _ in range(80))
        question = "".join(rng.choice(RARE_CJK) for _ in range(20)) + "？"
        row = {"row_id": f"r{i:02d}", "question": question, "ground_truth": sentence, "contexts": [sentence, other]}
        rows.append(row)
    return rows


def test_batch_on_cjk_text_never_commits_more_than_its_cost_cap(prefect_harness, judge_env, tmp_path) -> None:
    """Before: the admission priced a line at its message bytes / 4 (0.75 token a character here) without the
    schema, so a cap just under the rows' cost let every row in and the run cost more than the cap."""
    judge_env.prompt_tokens_of = _cjk_tokens
    data = write_parquet(tmp_path / "cjk.parquet", _cjk_rows(12))
    full = cli(judge_env, data, tmp_path / "full", "--batch")
    assert full.exit_code == 0, full.output
    (whole,) = runs(tmp_path / "full")
    cap = round(whole["cost_usd"] * 0.95, 8)
    capped = cli(judge_env, data, tmp_path / "out", "--batch", "--max-cost-usd", f"{cap:.8f}")
    out = Path(tmp_path / "out")
    committed = sum(r["cost_usd"] or 0.0 for r in runs(out)) if (out / "runs").exists() else 0.0
    print(f"\n[cjk batch] 12 rows cost {whole['cost_usd']:.6f}; --max-cost-usd {cap:.6f}: exit {capped.exit_code}, "
          f"committed {committed:.6f}")  # fmt: skip
    assert committed <= cap, capped.output
    if (out / "results").exists():
        judged = [r for r in results(out).values() if r["score"] is not None]
        assert len(judged) < 12
    assert DeltaTable(str(tmp_path / "full" / "runs")).to_pyarrow_table().num_rows >= 1
