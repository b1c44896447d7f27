"""``recall-bench demo --regression``: a regression a newcomer can see with no key and no server to start.

The bundled sample is scored twice by the offline lexical judge (deterministic): as "index v1" with the sample's
own contexts, then as "index v2" with the contexts of a retrieval file in which every row that has two chunks or
more lost its first one (what a worse index build returns), through ``--retrieval-uri`` as an index build would
hand them over. The second run is compared with the first (``--baseline label:index-v1``) and the rows it lost
are listed: the comparison says ``regressed``, exit 0 (a regression fails a run only with
``--fail-on-regression``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from rich.text import Text

from recall_tasks.cli.common import _store, console
from recall_tasks.cli.losses import print_losses
from recall_tasks.cli.outcome import print_outcome
from recall_tasks.cli.run_flow import _run
from recall_tasks.config import RunParams

V1, V2 = "index-v1", "index-v2"


def degraded_contexts(rows: list[dict[str, Any]]) -> pa.Table:
    """The "index v2" retrieval file: each row's contexts without the first chunk when it has two or more."""
    contexts = [r["retrieval_context"][1:] if len(r["retrieval_context"]) > 1 else r["retrieval_context"] for r in rows]
    row_ids = [r["row_id"] for r in rows]
    return pa.table({"row_id": row_ids, "retrieval_context": pa.array(contexts, pa.list_(pa.string()))})


def run_two_index_versions(dataset: Path, rows: list[dict[str, Any]], output: str, debug: bool) -> int:
    """Score index v1 and index v2 of the sample into ``output``; print v2's outcome and the rows it lost."""
    common: dict[str, Any] = {
        "dataset_uri": str(dataset), "output_uri": output, "judge": "lexical", "on_missing": "skip",
        "segment_by": ["category"], "chunk_size": 4,
    }  # fmt: skip
    first = _run(RunParams(**common, label=V1, index_version="v1", baseline=None), debug)
    if first["status"] == "batch_pending" or first["status"] == "batch_idle":  # the demo never batches
        raise RuntimeError(f"the demo run ended {first['status']}")
    console.print(
        Text(f"index v1: run {first['run_id']}, mean {first['mean_score']:.4g} (the sample's own contexts)"),
        soft_wrap=True,
    )
    retrieval = dataset.parent / "retrieval-v2.parquet"
    pq.write_table(degraded_contexts(rows), retrieval)
    console.print(
        Text(f"index v2: the same questions, each context without its first chunk ({retrieval})\n"), soft_wrap=True
    )
    second = _run(
        RunParams(**common, label=V2, index_version="v2", retrieval_uri=str(retrieval), baseline=f"label:{V1}"), debug
    )
    if second["status"] == "batch_pending" or second["status"] == "batch_idle":
        raise RuntimeError(f"the demo run ended {second['status']}")
    print_outcome(second, output)
    print_losses(second, output, _store(output, "delta", None))  # what a regressed `run` prints too
    return 0
