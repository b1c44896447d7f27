"""``run --dry-run``: the bill before paying, against the fake OpenAI server and a real run after it.

The dry run reads the dataset and the row cache, contacts no endpoint, writes nothing, exits 0, and its token and
cost estimate is an upper bound of what the real run then records in the runs table (within 3x of it here).
"""

from __future__ import annotations

import re

import pytest
from deltalake import DeltaTable
from typer.testing import CliRunner

from recall_tasks.cli import app as cli
from recall_tasks.config import RunParams
from recall_tasks.pipeline.flow import recall_benchmark
from tests import judge_script
from tests.test_pipeline import KEY, make_rows, write_parquet


def _dry(data: str, out, base_url: str, *extra: str) -> str:
    argv = ["run", data, "-o", str(out), "--judge", "openai", "--base-url", base_url, "--dry-run", *extra]
    result = CliRunner().invoke(cli.app, argv)
    assert result.exit_code == 0, result.output
    return result.output


def _number(text: str, pattern: str) -> float:
    found = re.search(pattern, text)
    assert found, text
    return float(found.group(1).replace(",", ""))


def test_dry_run_judges_nothing_writes_nothing_and_estimates_the_real_run(prefect_harness, fake_openai, tmp_path,
                                                                          monkeypatch):  # fmt: skip
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    rows = [{k: v for k, v in r.items() if k != "row_id"} for r in make_rows(40, seed=77)]
    rows[30:] = rows[:10]  # ten duplicates (own row ids): each shares its first copy's request, in the run too
    data = write_parquet(tmp_path / "data" / "eval.parquet", rows)
    out = tmp_path / "out"

    text = _dry(data, out, fake_openai.base_url, "--max-requests", "12", "--max-cost-usd", "0.0005",
                "--tpm", "2000")  # fmt: skip
    assert fake_openai.requests == [] and not out.exists()  # no call (no pre-flight either), nothing written
    assert "40 rows, 0 served by the row cache, 30 judge requests (one per distinct row)" in text
    assert "--max-requests 12 stops after ~12 rows" in text
    assert re.search(r"--max-cost-usd 0.0005 stops after ~\d+ rows", text), text  # above one request's worst case
    assert re.search(r"--tpm 2000: ~\d+\.\d minutes", text), text
    prompt = _number(text, r"~([\d,]+) prompt")
    cost = _number(text, r"cost: ~\$([\d.]+) live")
    batch = _number(text, r"~\$([\d.]+) at the batch price")
    assert abs(batch - cost / 2) <= 0.0001

    recall_benchmark(
        RunParams(dataset_uri=data, output_uri=str(out), judge="openai", base_url=fake_openai.base_url, chunk_size=40)
    )
    runs = DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist()
    assert len(runs) == 1 and runs[0]["requests"] == 30 and len(fake_openai.chat_requests) == 30
    # an upper bound (the one token estimate, schema included), never below what the run records; the fake counts
    # characters / 4 of the messages alone, so the bound is well above it
    assert runs[0]["prompt_tokens"] <= prompt <= 3 * runs[0]["prompt_tokens"], (prompt, runs[0])
    assert runs[0]["cost_usd"] <= cost <= 3 * runs[0]["cost_usd"], (cost, runs[0])

    again = _dry(data, out, fake_openai.base_url)  # every row now in the row cache
    assert "40 rows, 40 served by the row cache, 0 judge requests" in again and "none would stop" in again


REFUSED = {
    "batch-lexical": ["--batch", "--judge", "lexical"],
    "unknown-catalog": ["--format", "iceberg", "--catalog", "nosuch"],
    "namespace-trailing-dot": ["--format", "iceberg", "--namespace", "a."],
    "max-cost-infinite": ["--max-cost-usd", "inf"],
    "segment-by-missing": ["--segment-by", "team"],
    "baseline-unknown": ["--baseline", "label:nope"],
}


def test_dry_run_refuses_what_the_run_refuses(prefect_harness, fake_openai, tmp_path, monkeypatch) -> None:
    """One check function for both (``steps.check_run``, the dry run without the endpoint probes): each refusal is
    the same ``error:`` line, exit 2, with no request to the judge and nothing written. Before, the dry run
    estimated ``--batch --judge lexical`` and an unknown ``--catalog``, which the run then refused."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    data = write_parquet(tmp_path / "data" / "eval.parquet", make_rows(6, seed=5))
    out = tmp_path / "out"
    for name, extra in REFUSED.items():
        lines = []
        for dry in (["--dry-run"], []):
            argv = ["run", data, "-o", str(out), "--judge", "openai", "--base-url", fake_openai.base_url, *extra, *dry]
            result = CliRunner().invoke(cli.app, argv, env={"COLUMNS": "400"})
            errors = [line for line in result.output.splitlines() if line.startswith("error:")]
            assert result.exit_code == 2 and len(errors) == 1, (name, dry, result.output)
            lines.append(errors[0])
        assert lines[0] == lines[1], name
        assert fake_openai.requests == [] and not out.exists(), name


def test_dry_run_estimates_claim_extraction(prefect_harness, fake_openai, tmp_path, monkeypatch) -> None:
    """``--units claims``: one extraction per distinct reference the claims cache does not hold, in the requests
    and the cost (before: "40 judge requests" where the run made 120); the run then records exactly that many."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.test_claims import claim_rows

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.claims_responder())
    rows = claim_rows(24, references=6)
    data = tmp_path / "data" / "eval.parquet"
    data.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), data)
    out = tmp_path / "out"

    text = _dry(str(data), out, fake_openai.base_url, "--units", "claims", "--max-requests", "20")
    assert fake_openai.requests == [] and not out.exists()
    assert "24 judge requests" in text and "claim extraction: 6 requests" in text, text
    assert "--max-requests 20 stops after ~20 of 30 requests" in text, text
    prompt = _number(text, r"~([\d,]+) prompt") + _number(text, r"claim extraction: .*?~([\d,]+) prompt")
    completion = _number(text, r"\+ ~([\d,]+) completion") + _number(text, r"claim extraction: .*?\+ ~([\d,]+) compl")
    cost = _number(text, r"cost: ~\$([\d.]+) live")

    params = RunParams(dataset_uri=str(data), output_uri=str(out), judge="openai", base_url=fake_openai.base_url,
                       units="claims", chunk_size=24)  # fmt: skip
    recall_benchmark(params)
    (run,) = DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist()
    assert run["requests"] == 30 == len(fake_openai.chat_requests)
    print(
        f"\n[claims dry run] estimated 30 requests, ~{prompt:.0f} + ~{completion:.0f} tokens, ${cost:.6f}; "
        f"the run: {run['requests']}, {run['prompt_tokens']} + {run['completion_tokens']}, ${run['cost_usd']:.6f}"
    )
    assert run["prompt_tokens"] <= prompt <= 3 * run["prompt_tokens"], (prompt, run)  # an upper bound, as above
    assert abs(completion - run["completion_tokens"]) <= 0.5 * run["completion_tokens"], (completion, run)
    assert run["cost_usd"] <= cost <= 3 * run["cost_usd"], (cost, run)

    # the index rebuilt: new contexts, the claims cached: judge requests priced on the cached claims, no extraction
    pq.write_table(pa.Table.from_pylist([{**r, "contexts": ["new filler", *r["contexts"]]} for r in rows]), data)
    again = _dry(str(data), out, fake_openai.base_url, "--units", "claims")
    assert "24 judge requests" in again and "claim extraction: 0 requests" in again, again


@pytest.mark.concurrency  # the SDK's platform headers run uname
def test_a_refusal_after_the_endpoint_probe_closes_the_judge(fake_openai, tmp_path, monkeypatch) -> None:
    """The probe (``GET /models``) opens the judge's HTTP client; a check that refuses after it (an unpriced model
    under ``--max-cost-usd``, a batch option) closes that client before the error leaves ``check_run``. Before, the
    client was left to the garbage collector, and its socket's ResourceWarning failed whichever later test it
    fell in."""
    from recall_tasks.errors import ConfigError
    from recall_tasks.pipeline import steps

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    data = write_parquet(tmp_path / "data" / "eval.parquet", make_rows(3, seed=5))
    made: list[object] = []
    closed: list[object] = []

    def spying_make_judge(params: RunParams):
        judge = make_judge(params)
        made.append(judge)
        close = judge.aclose

        async def aclose() -> None:
            closed.append(judge)
            await close()

        judge.aclose = aclose  # type: ignore[method-assign]
        return judge

    from recall_tasks.pipeline.components import make_judge

    monkeypatch.setattr(steps, "make_judge", spying_make_judge)
    refusals = {
        "unpriced": {"model": "llama-3-70b", "max_cost_usd": 1.0},
        "batch without cache": {"batch": True, "cache": False},
    }
    for name, extra in refusals.items():
        params = RunParams(dataset_uri=data, output_uri=str(tmp_path / "out"), judge="openai",
                           base_url=fake_openai.base_url, **extra)  # fmt: skip
        made.clear(), closed.clear()
        with pytest.raises(ConfigError):
            steps.check_run(params)
        assert len(made) == 1 and closed == made, name
    assert not (tmp_path / "out").exists()
