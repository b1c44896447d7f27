"""ragas' side of ``benchmarks/vs_ragas.py``: one whole ragas process, run with the ragas venv's Python.

    RAGAS_VENV/bin/python benchmarks/_ragas_child.py DATA.parquet BASE_URL [--workers 100] [--api evaluate|ascore]

The dataset's rows (ragas' own column names ``user_input``, ``retrieved_contexts``, ``reference``) scored on
``llm_factory(model, client=AsyncOpenAI(base_url=BASE_URL))`` (``OPENAI_API_KEY`` from the environment), as
ragas' documentation sets them up:

- ``--api evaluate`` (default): an ``EvaluationDataset``, ``LLMContextRecall``,
  ``evaluate(..., run_config=RunConfig(max_workers=WORKERS))``, the scores read back from the result's DataFrame;
- ``--api ascore``: the metric's async API without ``evaluate()``'s executor, progress bar and callbacks:
  ``ragas.metrics.collections.ContextRecall(llm=...).ascore(**row)`` for every row under ``asyncio.gather``,
  ``WORKERS`` at a time (an ``asyncio.Semaphore``).

Prints one JSON line: rows, scored (not NaN), their mean, ragas' version. Imports nothing from this project
(ragas' venv does not have it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from typing import Any


async def ascore_all(llm: Any, rows: list[dict[str, Any]], workers: int) -> list[float]:
    from ragas.metrics.collections import ContextRecall

    metric = ContextRecall(llm=llm)
    slots = asyncio.Semaphore(workers)

    async def one(row: dict[str, Any]) -> float:
        async with slots:
            return float((await metric.ascore(**row)).value)

    return list(await asyncio.gather(*(one(row) for row in rows)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("base_url")
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--model", default="gpt-4o-mini")
    parser.add_argument("--api", choices=("evaluate", "ascore"), default="evaluate")
    args = parser.parse_args()

    import pyarrow.parquet as pq
    import ragas
    from openai import AsyncOpenAI
    from ragas.llms import llm_factory

    rows = pq.read_table(args.data, columns=["user_input", "retrieved_contexts", "reference"]).to_pylist()
    llm = llm_factory(args.model, client=AsyncOpenAI(base_url=args.base_url))
    if args.api == "evaluate":
        from ragas import EvaluationDataset, RunConfig, evaluate
        from ragas.metrics import LLMContextRecall

        result = evaluate(
            EvaluationDataset.from_list(rows),
            metrics=[LLMContextRecall(llm=llm)],
            run_config=RunConfig(max_workers=args.workers),
        )
        scores = [float(s) for s in result.to_pandas()["context_recall"]]
    else:
        scores = asyncio.run(ascore_all(llm, rows, args.workers))
    scored = [s for s in scores if not math.isnan(s)]
    mean = sum(scored) / len(scored) if scored else None
    print(json.dumps({"rows": len(scores), "scored": len(scored), "mean": mean, "ragas": ragas.__version__}))


if __name__ == "__main__":
    main()
