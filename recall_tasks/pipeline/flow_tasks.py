"""The chunk as a Prefect task: its retry rule. Nothing of it is cached or persisted by Prefect.

Part of the Prefect adapter (with :mod:`~recall_tasks.pipeline.flow`, which submits these tasks): Prefect is
imported here and in the flow module only (``tests/test_layers.py``). The ``threads`` task takes the plan in
memory; the ``processes``/``dask`` one a picklable :class:`~recall_tasks.pipeline.workers.ChunkSpec`.

No task cache: Prefect's result records are cloudpickle (a record names its own serializer, so a JSON serializer
on our side would not stop a planted pickle record from being loaded), and a record found under a storage a
parameter or a shared prefix names is data, never code to run (docs/security.md). The one verdict store is the
row cache (``io/cache.py``): a rerun's rows are served from it, chunk by chunk, with no judge call.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from recall_tasks.errors import JudgeTransientError, StorageError
from recall_tasks.pipeline import steps, workers
from recall_tasks.pipeline.run import ChunkReport, RunPlan
from recall_tasks.pipeline.workers import ChunkSpec


def _transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a chunk only for failures that may pass: storage hiccups and judge transients."""
    try:
        state.result()
    except (StorageError, JudgeTransientError, ConnectionError, TimeoutError):
        return True
    except Exception:  # noqa: BLE001 - configuration errors and bugs are not retried
        return False
    return False


#: The chunk task's name and retry rule; never cached, its result never persisted.
_CHUNK_TASK: dict[str, Any] = {
    "name": "score-chunk", "retries": 2, "retry_delay_seconds": [2, 10], "retry_condition_fn": _transient,
    "cache_policy": NO_CACHE, "persist_result": False,
}  # fmt: skip


@task(**_CHUNK_TASK)
def score_chunk(plan: RunPlan, seq: int, key: str) -> ChunkReport:
    """Score one chunk of rows and write its result file (a retry rewrites the same file).

    The rows are not a task parameter: Prefect keeps task parameters referenced after the run, which grew the
    flow by ~1 MB per chunk. The flow parks each chunk in its window (``plan.window.pending``) until its task
    settles.
    """
    return steps.score_chunk(plan, seq, plan.window.pending[seq], key)


@task(**_CHUNK_TASK)
def score_chunk_spec(spec: ChunkSpec) -> ChunkReport:
    """Score one chunk in a worker process (``--task-runner processes|dask``): see ``pipeline/workers.py``."""
    return workers.score_spec(spec)
