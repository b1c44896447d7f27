"""ragas' side of ``benchmarks/vs_ragas.py``: one whole ragas process, run with the ragas venv's Python.

    RAGAS_VENV/bin/python benchmarks/_ragas_child.py DATA.parquet BASE_URL [--workers 100] [--model gpt-4o-mini]

As ragas' documentation sets it up: the dataset's rows (ragas' own column names ``user_input``,
``retrieved_contexts``, ``reference``) into an ``EvaluationDataset``, ``LLMContextRecall`` on
``llm_factory(model, client=AsyncOpenAI(base_url=BASE_URL))`` (``OPENAI_API_KEY`` from the environment),
``evaluate(..., run_config=RunConfig(max_workers=WORKERS))``, and the scores read back from the result's
DataFrame. Prints one JSON line: rows, scored (not NaN), their mean, ragas' version. Imports nothing from this
project (ragas' venv does not have it).
"""

from __future__ import annotations

import argparse
import json
import math


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("base_url")
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--model", default="gpt-4o-mini")
    args = parser.parse_args()

    import pyarrow.parquet as pq
    import ragas
    from openai import AsyncOpenAI
    from ragas import EvaluationDataset, RunConfig, evaluate
    from ragas.llms import llm_factory
    from ragas.metrics import LLMContextRecall

    rows = pq.read_table(args.data, columns=["user_input", "retrieved_contexts", "reference"]).to_pylist()
    llm = llm_factory(args.model, client=AsyncOpenAI(base_url=args.base_url))
    result = evaluate(
        EvaluationDataset.from_list(rows),
        metrics=[LLMContextRecall(llm=llm)],
        run_config=RunConfig(max_workers=args.workers),
    )
    scores = [float(s) for s in result.to_pandas()["context_recall"]]
    scored = [s for s in scores if not math.isnan(s)]
    mean = sum(scored) / len(scored) if scored else None
    print(json.dumps({"rows": len(scores), "scored": len(scored), "mean": mean, "ragas": ragas.__version__}))


if __name__ == "__main__":
    main()
