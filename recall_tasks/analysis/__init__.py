"""Run-level figures from result tables: aggregates, regression statistics and verdicts, baseline tracking."""
