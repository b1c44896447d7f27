# Every target sets up .venv first, installed from uv.lock (exact versions and hashes, the same set on every machine
# and every day). uv itself is pinned and bootstrapped into .tools/ with the system pip; the stamp makes a second
# run skip the install when neither pyproject.toml nor uv.lock changed. `--locked` fails when uv.lock no longer
# matches pyproject.toml: after editing the dependencies, run `make lock` and commit uv.lock (docs/development.md).
PY ?= python3
UV_VERSION := 0.13.9
VENV := .venv
BIN := $(VENV)/bin
TOOLS := .tools
UV := $(TOOLS)/bin/uv
STAMP := $(VENV)/.installed
# the demo needs only the runtime set (no test servers, linters or type checker: ~250 MB less to fetch on a
# fresh machine); --inexact keeps the dev extras if make test installed them first
RUNTIME_STAMP := $(VENV)/.installed-runtime
export UV_PROJECT_ENVIRONMENT := $(VENV)
export UV_PYTHON_DOWNLOADS := never
# bytecode compiled at install, on every core: a fresh clone's first demo and the local server's first boot read
# it instead of compiling as they import (demo from a fresh state 34 s -> 19 s for +12 s of install, and every
# process that runs with PYTHONDONTWRITEBYTECODE, as CI's test subprocesses may, reads it too)
export UV_COMPILE_BYTECODE := 1
# ... and this project's own modules too: with PYTHONDONTWRITEBYTECODE in the environment (this machine sets it)
# each of the suite's CLI processes compiled recall_tasks from source (~0.12 s of CPU a process) and every pytest
# process rewrote the test modules' asserts again (half of a collection's 12 s); unexported, the first process
# writes the bytecode (gitignored __pycache__, written atomically) and the next ones read it
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv lock lock-upgrade test test-flaky test-fast test-oldest-openai demo demo-regression check lint types bench wheel clean

venv: $(STAMP)

$(UV):
	$(PY) -m pip install --quiet --disable-pip-version-check --root-user-action ignore --target $(TOOLS) uv==$(UV_VERSION)

$(STAMP): pyproject.toml uv.lock | $(UV)
	$(UV) sync --quiet --locked --extra dev --python $(PY)
	touch $(STAMP) $(RUNTIME_STAMP)

$(RUNTIME_STAMP): pyproject.toml uv.lock | $(UV)
	$(UV) sync --quiet --locked --inexact --python $(PY)
	touch $(RUNTIME_STAMP)

# uv.lock after an edit of pyproject.toml (keeps every other pin); lock-upgrade moves every pin to the newest allowed
lock: | $(UV)
	$(UV) lock

lock-upgrade: | $(UV)
	$(UV) lock --upgrade

# One pytest worker per core plus one (pytest-xdist): most integration tests wait on servers and subprocesses,
# and the extra worker fills those waits (the parallel part on this 2-core machine: 504 s with 3 workers at
# c510732, 574 s with 2 at c12ef5a in a clean clone). Each worker has its own Prefect test server, fake OpenAI
# server and SeaweedFS.
# PYTEST_WORKERS=0 runs serially (a debugger, -x, -s). Tests marked serial measure a share of a rate quota, which
# another worker's load would cut: they run alone after the rest.
PYTEST_WORKERS ?= $(shell $(PY) -c 'import os; print(len(os.sched_getaffinity(0)) + 1)')
# Each worker takes the next test in collection order when it is nearly idle, and the tests sharing a module-scoped
# fixture go to one worker as one unit (tests/conftest.py collects the longest first and adds the xdist_group marks):
# the long tests start in the first minutes instead of one of them running alone at the end, and no module fixture
# (a Prefect server, a built wheel) is set up on two workers.
PYTEST_DIST := --dist loadgroup --no-loadscope-reorder
# The files holding the serial tests: the second step collects only them, not the whole suite again (~10 s of
# imports and assertion rewriting). tests/conftest.py refuses a serial test in a file not listed here.
SERIAL_TESTS := tests/test_ratelimit_fleet.py

# Both parts always run (a failure in the first must not hide the second's), each reports, and make fails if either
# failed. Every test has a time limit (pytest-timeout, pyproject.toml): a hang fails in minutes, not at CI's limit.
test: $(STAMP)
	@parallel=0; serial=0; \
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) $(PYTEST_DIST) -m "not serial" --durations=30 || parallel=$$?; \
	$(BIN)/python -m pytest -q -m serial $(SERIAL_TESTS) || serial=$$?; \
	echo "make test: parallel part exit $$parallel, serial part exit $$serial"; \
	test $$parallel -eq 0 && test $$serial -eq 0

# The guard against flaky tests: each test marked concurrency (it starts servers, clusters, processes or signals)
# N times over, on the same workers as make test (docs/development.md). Not part of CI: minutes per repeat.
# TESTS: the test files to take them from (default: all), to run N=20 in parts.
N ?= 20
TESTS ?=
test-flaky: $(STAMP)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) -m "concurrency and not serial" --count $(N) $(TESTS)

# The judge's tests on the oldest openai that pyproject.toml allows: the judge uses the SDK's public API only, but the
# bound is where what it uses began (3.0: an httpx2 client passed as http_client; before it the SDK took httpx's),
# and the bytes it sends, its retries and errors are the SDK's: an allowed version that sends, retries or raises
# otherwise fails here, not at a user's. The locked set in a venv of its own (under .tools/), then openai alone moved
# down to the lower bound (CI, after make test).
OLDEST_VENV := $(TOOLS)/venv-oldest-openai
OPENAI_LOWEST = $(shell sed -n 's/^ *"openai\[aiohttp\]>=\([0-9.]*\),.*/\1/p' pyproject.toml)
JUDGE_TESTS := tests/test_judge_faults.py tests/test_judge_transport.py tests/test_openai_judge.py tests/test_wire_golden.py

test-oldest-openai: | $(UV)
	test -n "$(OPENAI_LOWEST)"
	UV_PROJECT_ENVIRONMENT=$(OLDEST_VENV) UV_COMPILE_BYTECODE=0 $(UV) sync --quiet --locked --extra dev --python $(PY)
	UV_COMPILE_BYTECODE=0 $(UV) pip install --quiet --python $(OLDEST_VENV)/bin/python "openai[aiohttp]==$(OPENAI_LOWEST)"
	$(OLDEST_VENV)/bin/python -c 'import openai; assert openai.__version__ == "$(OPENAI_LOWEST)" or openai.__version__.startswith("$(OPENAI_LOWEST).0"), openai.__version__; print("openai", openai.__version__)'
	$(OLDEST_VENV)/bin/python -m pytest -q -n $(PYTEST_WORKERS) -m "not serial" $(JUDGE_TESTS)

# the inner loop: everything but the tests that start servers or CLI processes (make test runs them all)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) -m "not integration"

demo: $(RUNTIME_STAMP)
	$(BIN)/recall-bench demo

# the sample scored as two index versions (v2 lost chunks) by the offline judge: a regression with no key
demo-regression: $(RUNTIME_STAMP)
	$(BIN)/recall-bench demo --regression

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

types: $(STAMP)
	$(BIN)/mypy

check: lint types test

bench: $(STAMP)
	$(BIN)/python benchmarks/throughput.py

# the wheel a user would install, in dist/ (tests/test_wheel.py installs it into a fresh venv and runs it)
wheel: | $(UV)
	$(UV) build --wheel --out-dir dist

clean:
	rm -rf $(VENV) $(TOOLS) dist recall-output .pytest_cache .mypy_cache .ruff_cache
