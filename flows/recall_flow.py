"""The deployments' entrypoints (``flows/recall_flow.py:recall_benchmark``, the flow the CLI runs, unchanged; and
``maintain_tables``, the optional nightly maintenance of the result tables).

The flow itself lives in the installed library (``recall_tasks.pipeline.flow``), so ``recall-bench run`` and a
Prefect worker run the same code, and no top-level ``flows`` package is installed into site-packages.
"""

from recall_tasks.pipeline.flow import maintain_tables, recall_benchmark

__all__ = ["maintain_tables", "recall_benchmark"]
