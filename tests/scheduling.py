"""How ``make test`` spreads the tests over its pytest-xdist workers (hooks imported by tests/conftest.py).

The suite is CPU-bound on a 2-core machine (~1,200 s of CPU for ~650 s of wall at c286e28), so two things matter:

* the longest tests start first: with ``--dist loadgroup --no-loadscope-reorder`` each worker takes the next
  test of the collection when it is nearly idle, and :data:`START_FIRST` puts the longest at the head of the
  collection. With ``--dist load`` and the collection's file order, the SIGKILL test of test_runners (104 s) was
  dealt late and ran alone at the end of the parallel step; the token-quota test (it mostly waits for its
  minute) now overlaps the others' CPU work instead. The two tests that mostly wait (the laptop recipe, the token
  quota) do not start together: with a worker in each, one core sat idle for the first minute.
* the tests of a file sharing a module-scoped fixture (a Prefect server and worker, a built and installed wheel,
  a Dask cluster, two CLI runs) run on one worker, one after the other: sent to two workers, each would set the
  fixture up again. pytest-xdist's own ``xdist_group`` marks do nothing under pytest 9 (xdist 3.8 renames
  ``item._nodeid``, which pytest 9 no longer reads), so the workers write each grouped test's group to a file
  and :func:`pytest_xdist_make_scheduler` reads it: the groups are found from the fixtures, no list to keep.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

#: The longest tests (seconds of one parallel step of a quiet clean-clone `make test` at bf0e444, 3 workers on 2
#: cores), longest first but for one wait (below); a prefix names every test it starts (all parameters, a whole
#: file). Collected first, started first.
START_FIRST = (
    "tests/test_laptop_recipe.py::",  # 93 s, mostly waiting for the worker and the triggered run
    "tests/test_deployments.py::test_deploy_then_index_built_events_run_the_flow",  # 46 s
    "tests/test_store_outage.py::test_store_down_mid_run_exits_4",  # 34 s
    "tests/test_alerts.py::test_alerts_reach_the_webhook_once_per_alerting_run",  # 34 s
    "tests/test_ratelimit_fleet.py::test_max_cost_usd_holds_for_the_whole_run_across_worker_processes",  # 33 s
    "tests/test_server.py::test_first_run_starts_the_server_the_next_reuses_it_and_the_commands_manage_it",  # 31 s
    # 88 s of waiting for its minute windows: not beside the laptop recipe's wait at the start, where it left a core
    # idle for a minute (a worker in each wait, ~1.3 of 2 cores busy); started ~1 minute in, it waits beside two
    # workers that use the cores, and still ends minutes before the last test
    "tests/test_token_quota.py::test_3000_token_prompts_keep_every_minute_within_the_token_quota",
    "tests/test_ratelimit_fleet.py::test_worker_processes_share_one_budget_instead_of_one_each",  # 28 s
    "tests/test_maintain.py::test_maintain_leaves_every_run_readable_exactly_once",  # 25 s and 8 cases of 2-10 s
    "tests/test_runners.py::test_sigkill_of_one_worker_process_then_rerun_gives_every_row_once",  # 24 s
    "tests/test_runners.py::test_processes_on_object_storage_share_the_row_cache_next_to_the_results",  # 23 s
    "tests/test_dask_paths.py::",  # 22 s
    "tests/test_browser.py::",  # 21 s and 4 more
    "tests/test_runners.py::test_worker_runs_equal_a_threads_run_in_two_processes_and_rerun_from_cache",  # 18 + 13 s
    "tests/test_readme_journeys.py::",  # 16 s
    "tests/test_iceberg.py::test_two_nights_on_iceberg_give_the_tables_verdicts_and_reports_of_delta",  # 16 + 10 s
    "tests/test_worker_state.py::test_a_chunk_ending_never_closes_the_budget_client_another_chunk_uses",  # 15 s
    "tests/test_wheel.py::",  # its module fixture builds and installs the wheel first
    "tests/test_interrupts.py::test_interrupt_stops_judging_commits_nothing_and_the_rerun_resumes",  # 3 x ~10 s
)

#: Where the workers write ``{nodeid: group}`` for the controller's scheduler (set by the controller, inherited)
_GROUPS_FILE = "RECALL_BENCH_XDIST_GROUPS"


def _start_rank(nodeid: str) -> int:
    return next((i for i, prefix in enumerate(START_FIRST) if nodeid.startswith(prefix)), len(START_FIRST))


def module_fixture_group(item: pytest.Item) -> str | None:
    """The test's file if the test uses a module-scoped fixture, else None."""
    info: Any = getattr(item, "_fixtureinfo", None)
    for name in info.names_closure if info else ():
        defs = info.name2fixturedefs.get(name, ())
        if defs and defs[-1].scope == "module":
            return item.nodeid.split("::", 1)[0]
    return None


def order_and_group(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Sort ``items`` longest first (stable: the rest keep the file order; a group goes where its first test
    goes), and on an xdist worker write the groups for the controller's scheduler."""
    groups = {item.nodeid: group for item in items if (group := module_fixture_group(item))}
    ranks = {item.nodeid: _start_rank(item.nodeid) for item in items}
    group_rank: dict[str, int] = {}
    for nodeid, group in groups.items():
        group_rank[group] = min(group_rank.get(group, ranks[nodeid]), ranks[nodeid])
    items.sort(key=lambda item: group_rank.get(groups.get(item.nodeid, ""), ranks[item.nodeid]))
    path = os.environ.get(_GROUPS_FILE)
    if path and hasattr(config, "workerinput"):  # every worker collects the same tests: the last write wins
        partial = f"{path}.{os.getpid()}"
        Path(partial).write_text(json.dumps(groups))
        os.replace(partial, path)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") == "loadgroup":
        os.environ[_GROUPS_FILE] = str(Path(tempfile.mkdtemp(prefix="recall-xdist-")) / "groups.json")


def pytest_unconfigure(config: pytest.Config) -> None:
    path = os.environ.get(_GROUPS_FILE)
    if path and not hasattr(config, "workerinput"):
        shutil.rmtree(Path(path).parent, ignore_errors=True)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with the groups the workers found (read once all workers have collected)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FixtureGroups(LoadGroupScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = {}
                with contextlib.suppress(OSError, ValueError):
                    self.groups = json.loads(Path(os.environ[_GROUPS_FILE]).read_text())
            return self.groups.get(nodeid) or super()._split_scope(nodeid)

    return FixtureGroups(config, log)
