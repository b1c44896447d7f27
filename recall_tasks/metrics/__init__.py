"""Metrics: contextual recall and context coverage, and the prompts their LLM judges use."""

from recall_tasks.metrics.base import Metric
from recall_tasks.metrics.coverage import ContextCoverage
from recall_tasks.metrics.recall import ContextualRecall

__all__ = ["ContextCoverage", "ContextualRecall", "Metric"]
