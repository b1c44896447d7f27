"""What ``--batch`` refuses, checked in ``steps.check_run`` before anything is written."""

from __future__ import annotations

from recall_tasks._sync import run_sync
from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError
from recall_tasks.judges.base import Judge
from recall_tasks.judges.capabilities import Batching


def check_batch(params: RunParams, judge: Judge, *, probe: bool = True) -> None:
    """``--batch`` needs the OpenAI judge, fixed contexts, sentence units, the row cache and an endpoint with a
    Batch API (probed: 404 on /batches or /files is refused before anything is uploaded). Raises ConfigError.
    ``probe=False`` (a dry run): every check but the endpoint's."""
    if params.judge != "openai":
        raise ConfigError("--batch needs --judge openai (the lexical judge makes no calls)")
    if not params.cache:
        raise ConfigError("--batch collects into the row cache: it cannot run with --no-cache")
    if params.units != "sentences":
        raise ConfigError("--batch supports --units sentences only (claim extraction is not batched yet)")
    if params.retriever or params.context_extractor:
        raise ConfigError(
            "--batch needs contexts that are the same at submit and collect time: a run-time --retriever or "
            "--context-extractor is not supported (use --retrieval-uri)"
        )
    if not isinstance(judge, Batching):
        raise ConfigError("--batch needs a judge with a Batch API client (--judge openai)")
    if not probe:
        return

    async def probe_endpoint() -> None:
        await judge.batch_client().probe()

    run_sync(probe_endpoint())
