"""The run's limits: the per-process guards (spending budget, circuit breaker) and their fleet-wide versions.

``guards`` holds :class:`~recall_tasks.fleet.guards.Budget` and :class:`~recall_tasks.fleet.guards.CircuitBreaker`
(one per worker process); ``rate`` puts ``--rpm``/``--tpm`` for every process sharing a limit key behind Prefect
global concurrency limits; ``budget`` extends ``--max-requests``/``--max-cost-usd`` to a whole run scored in worker
processes. The layer sits below the pipeline: it knows judges and configuration, never a run's steps.
"""
