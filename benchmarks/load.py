"""The machine's load around a benchmark's runs: every figure says whether it was measured on a quiet machine.

A figure whose run began with a 1-minute load average (``os.getloadavg``) above :data:`QUIET_LOAD` is stamped
``loaded``: on a shared machine the heavier of two compared tools loses more to the load, so such a figure is
not one the README quotes (issue 42). The scripts print each run's load before it starts and, for each figure,
``loaded`` if any run behind it began loaded (``quiet`` otherwise).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

#: A run that begins above this 1-minute load is ``loaded``.
QUIET_LOAD = 1.0

NOT_FOR_README = (
    f"figures stamped 'loaded' (a run behind them began at a 1-minute load above {QUIET_LOAD:g}) are not for the "
    "README: measure again on a quiet machine"
)


def load_1min() -> float:
    """The machine's 1-minute load average now."""
    return os.getloadavg()[0]


def settle(max_wait_s: float) -> float:
    """Wait up to ``max_wait_s`` for the 1-minute load to fall to :data:`QUIET_LOAD` (a benchmark's own previous
    run raises it: the average decays over about a minute), then return it; 0 waits for nothing."""
    deadline = time.monotonic() + max_wait_s
    load = load_1min()
    while load > QUIET_LOAD and time.monotonic() < deadline:
        time.sleep(min(2.0, max(deadline - time.monotonic(), 0.0)))
        load = load_1min()
    return load


def stamp(loads: Iterable[float]) -> str:
    """``loaded`` if any of the runs behind a figure began above :data:`QUIET_LOAD`, else ``quiet``."""
    return "loaded" if any(load > QUIET_LOAD for load in loads) else "quiet"


def summary(loads: list[float]) -> str:
    """One line: the runs' loads before they began, and the stamp of the whole set."""
    if not loads:
        return "no runs"
    return f"1-minute load before the runs: {min(loads):.2f}-{max(loads):.2f} ({stamp(loads)})"
