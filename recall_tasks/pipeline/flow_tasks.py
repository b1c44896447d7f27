"""The chunk as a Prefect task: its retry rule, Prefect's chunk cache keyed on the chunk's content, its storage.

Part of the Prefect adapter (with :mod:`~recall_tasks.pipeline.flow`, which submits these tasks): Prefect is
imported here and in the flow module only (``tests/test_layers.py``). The ``threads`` task takes the plan in
memory; the ``processes``/``dask`` one a picklable :class:`~recall_tasks.pipeline.workers.ChunkSpec`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from typing import Any, cast

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext

from recall_tasks.config import RunParams
from recall_tasks.errors import JudgeTransientError, StorageError
from recall_tasks.io.storage import StorageConfig
from recall_tasks.pipeline import steps, workers
from recall_tasks.pipeline.run import ChunkReport, RunPlan
from recall_tasks.pipeline.workers import ChunkSpec

_CACHE_PREFIX = "recall-chunk-"


def _transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a chunk only for failures that may pass: storage hiccups and judge transients."""
    try:
        state.result()
    except (StorageError, JudgeTransientError, ConnectionError, TimeoutError):
        return True
    except Exception:  # noqa: BLE001 - configuration errors and bugs are not retried
        return False
    return False


def _chunk_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    """Prefect's chunk cache key: the chunk's content address (rows, pass-through values, judge config)."""
    return _CACHE_PREFIX + str(parameters["key"])


#: The chunk task's name and retry rule, shared by its cached and uncached forms.
_CHUNK_TASK: dict[str, Any] = {
    "name": "score-chunk", "retries": 2, "retry_delay_seconds": [2, 10], "retry_condition_fn": _transient,
}  # fmt: skip


@task(**_CHUNK_TASK, cache_key_fn=_chunk_cache_key, persist_result=True)
def score_chunk(plan: RunPlan, seq: int, key: str) -> ChunkReport:
    """Score one chunk of rows and write its result file (a retry rewrites the same file).

    The rows are not a task parameter: Prefect keeps task parameters referenced after the run, which grew the
    flow by ~1 MB per chunk. The flow parks each chunk in its window (``plan.window.pending``) until its task
    settles.
    """
    return steps.score_chunk(plan, seq, plan.window.pending[seq], key)


#: ``--no-cache``: the same task function without Prefect's cache. Not ``score_chunk.with_options(cache_policy=
#: NO_CACHE)``: ``with_options`` cannot drop ``cache_key_fn``, and Prefect then warned on every such run that both
#: ``cache_policy`` and ``cache_key_fn`` were set. Same name, retries and retry rule.
score_chunk_uncached = task(**_CHUNK_TASK, cache_policy=NO_CACHE, persist_result=False)(score_chunk.fn)


def _spec_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    """The same cache key as :func:`_chunk_cache_key`: a threads run and a processes run share the chunk cache."""
    return _CACHE_PREFIX + str(parameters["spec"].key)


@task(**_CHUNK_TASK, cache_key_fn=_spec_cache_key, persist_result=True)
def score_chunk_spec(spec: ChunkSpec) -> ChunkReport:
    """Score one chunk in a worker process (``--task-runner processes|dask``): see ``pipeline/workers.py``."""
    return workers.score_spec(spec)


score_chunk_spec_uncached = task(**_CHUNK_TASK, cache_policy=NO_CACHE, persist_result=False)(score_chunk_spec.fn)


def chunk_cache_storage(params: RunParams) -> Any:
    """Prefect result storage for the chunk cache: ``block:<slug>``, an fsspec URL, or a local path.

    Prefect only accepts saved blocks as result storage, so a URL or path is saved as a block named after it,
    WITHOUT credentials: s3fs (or gcsfs/adlfs) reads them from the worker's environment at run time.
    """
    from prefect.filesystems import LocalFileSystem, RemoteFileSystem, WritableFileSystem

    spec = cast(str, workers.cache_storage(params))
    if spec.startswith("block:"):
        return WritableFileSystem.load(spec.removeprefix("block:"))
    name = "recall-chunk-cache-" + hashlib.sha256(spec.encode()).hexdigest()[:12]
    block: Any
    if "://" in spec and not spec.startswith("file://"):
        settings: dict[str, Any] = {}
        if spec.startswith(("s3://", "s3a://")):
            storage = StorageConfig.from_options(params.storage_options)
            if storage.endpoint_url:
                settings["endpoint_url"] = storage.endpoint_url
            if storage.region:
                settings["client_kwargs"] = {"region_name": storage.region}
        block = RemoteFileSystem(basepath=spec, settings=settings)
    else:
        block = LocalFileSystem(basepath=os.path.abspath(spec.removeprefix("file://")))
    block.save(name, overwrite=True)
    return block


def chunk_task(params: RunParams) -> Any:
    """The chunk task with this run's cache settings (storage, expiry, refresh, or no cache).

    ``threads``: the task takes the plan in memory; ``processes``/``dask``: a :class:`ChunkSpec`.
    """
    in_process = params.task_runner == "threads"
    if not params.cache:
        return score_chunk_uncached if in_process else score_chunk_spec_uncached
    options: dict[str, Any] = {
        "cache_expiration": dt.timedelta(days=params.chunk_cache_days),
        "refresh_cache": params.refresh_cache,
    }
    if workers.cache_storage(params):
        options["result_storage"] = chunk_cache_storage(params)
    return (score_chunk if in_process else score_chunk_spec).with_options(**options)
