"""The benchmark run: planning, chunk scoring, commits, outcomes, and the Prefect glue (artifacts, events)."""
