"""The scope of a fixture whose state a test reads as fresh: a module's, except when tests are repeated.

A Prefect server with its automations, flow runs and events, a webhook receiver's inbox, a clone's output
folder: each test of a module asserts what *it* made there ("created automation", 4 flow runs, 12 scores),
which a module-scoped fixture satisfies once per module. Under ``make test-flaky`` (pytest-repeat's
``--count N``) the N runs of one test would share it, and every run after the first read the ones before it:
that failed 2 runs in 3 of tests/test_deployments.py, test_alerts.py and test_readme_journeys.py for reasons
that have nothing to do with flakiness. Repeated, such a fixture is set up for each test instead.
"""

from __future__ import annotations

import pytest


def module_unless_repeated(fixture_name: str, config: pytest.Config) -> str:
    """``"module"``; ``"function"`` under ``--count`` above 1 (pytest's dynamic fixture scope)."""
    count = config.getoption("count", default=1) or 1
    return "function" if int(count) > 1 else "module"
