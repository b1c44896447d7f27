"""The library path of ``benchmarks/cpu_per_row.py`` in its own process: ``a_measure`` + ``gather`` on a dataset.

    PYTHONPATH=<checkout> python benchmarks/_cpu_child.py DATA.parquet BASE_URL --concurrency 100

Run by path with ``PYTHONPATH`` set to the checkout whose ``recall_tasks`` is measured (this file imports nothing
from ``benchmarks``, so another checkout's code runs under the same harness). Warms up on the first
``--warm`` rows (client, connections, imports), then times every row at once: CPU seconds of the whole process
(``time.process_time``: all threads) and wall seconds. Prints JSON on the last line, with the rows timed, the
warm-up rows (judged too: the judge's request count covers both) and a digest of the scores so both checkouts can
be seen to agree.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time

import pyarrow.parquet as pq


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("base_url")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--warm", type=int, default=100)
    parser.add_argument("--profile", default=None, help="write a pyinstrument text profile of the timed part here")
    args = parser.parse_args()

    from recall_tasks import ContextualRecall, OpenAIJudge, RecallCase

    table = pq.read_table(args.data)
    cases = [
        RecallCase(input=q, expected_output=ref, retrieval_context=ctx)
        for q, ref, ctx in zip(
            table.column("user_input").to_pylist(),
            table.column("reference").to_pylist(),
            table.column("retrieved_contexts").to_pylist(),
            strict=True,
        )
    ]
    judge = OpenAIJudge(
        model="gpt-4o-mini", base_url=args.base_url, api_key="sk-bench", max_concurrency=args.concurrency
    )
    metric = ContextualRecall(judge=judge)

    async def run() -> dict:
        await asyncio.gather(*(metric.a_measure(c) for c in cases[: args.warm]))
        profiler = None
        if args.profile:
            from pyinstrument import Profiler

            profiler = Profiler(async_mode="disabled")
            profiler.start()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        results = await asyncio.gather(*(metric.a_measure(c) for c in cases))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        if profiler is not None:
            profiler.stop()
            with open(args.profile, "w") as fh:
                fh.write(profiler.output_text(show_all=True, timeline=False))
        await judge.aclose()
        digest = hashlib.sha256(json.dumps([r.score for r in results]).encode()).hexdigest()[:12]
        return {"rows": len(cases), "warm": len(cases[: args.warm]), "cpu_s": cpu, "wall_s": wall, "scores": digest}

    print(json.dumps(asyncio.run(run())), flush=True)


if __name__ == "__main__":
    main()
