"""``--metric retrieval_ids``: the id-based retrieval metrics alone (issue 41): no judge, no key, no request.

The run's pieces that expect a metric and a judge (fingerprints, the runs table's ``judge_model`` and
``prompt_version``, comparability) get :class:`NoJudge`, which never answers: a ``retrieval_ids`` run's chunks are
scored by ``pipeline/ids_step.score_ids_block``, never by the judge path. The metrics themselves are
:mod:`recall_tasks.metrics.ids_compute`.
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

from recall_tasks.judges.base import JudgeRequest, JudgeResponse, Task
from recall_tasks.metrics.base import Metric, Missing, Prepared
from recall_tasks.metrics.claims import Units
from recall_tasks.models import RecallCase

#: The version of the id metrics' definitions (trec_eval's): part of the fingerprint, recorded as ``prompt_version``
IDS_VERSION = "ids-1"
#: ``runs.judge_model`` of a retrieval_ids run
NO_JUDGE = "none"


class NoJudge:
    """The judge of a ``retrieval_ids`` run: named, fingerprinted, never asked."""

    max_concurrency = 1

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = dict(settings)

    @property
    def model(self) -> str:
        return NO_JUDGE

    @property
    def prompt_version(self) -> str:
        return IDS_VERSION

    def config(self) -> dict[str, Any]:
        return {"judge": NO_JUDGE, "version": IDS_VERSION, **self.settings}

    async def judge(self, request: JudgeRequest) -> JudgeResponse:
        raise RuntimeError("a retrieval_ids run has no judge: its rows are scored from their ids")


class RetrievalIds(Metric):
    """The id metrics as the run's metric: ``score`` is the ``--verdict-metric`` value of the row."""

    task: ClassVar[Task] = cast("Task", "retrieval_ids")
    display_name: ClassVar[str] = "Retrieval (ids)"
    unit: ClassVar[str] = "relevant document"
    evidence_unit: ClassVar[str] = "retrieved document"

    def prepare(self, case: RecallCase, context: list[str] | None, units: Units | None = None) -> Prepared | Missing:
        return Missing("reference_context_ids")  # never judged: see pipeline/ids_step.score_ids_block
