"""docs/deployments.md's deploy block in a fresh shell: it runs as written, and its guard stops an empty value.

The block's ``prefect deploy`` needs a remote Prefect server, so it runs against a ``.venv/bin/prefect`` that
prints what it was given: the block's shell (exports, guard, command) is what is under test.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "deployments.md"


def deploy_block() -> str:
    section = DOC.read_text().split("\n## 2. Deploy\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 1
    return blocks[0]


def fresh_bash(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``bash -c`` in an environment without any ``RECALL_*`` variable, as a new terminal has."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALL_")}
    return subprocess.run(["bash", "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    prefect = tmp_path / ".venv" / "bin" / "prefect"
    prefect.parent.mkdir(parents=True)
    prefect.write_text('#!/bin/sh\necho "prefect $* dataset=$RECALL_DATASET_URI output=$RECALL_OUTPUT_URI"\n')
    prefect.chmod(0o755)
    return tmp_path


@pytest.mark.concurrency
def test_the_deploy_block_runs_as_written_in_a_fresh_shell(checkout: Path) -> None:
    done = fresh_bash(deploy_block(), checkout)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "prefect --no-prompt deploy --prefect-file deployments/prefect.yaml --all "
        "dataset=s3://my-bucket/evals/golden.parquet output=s3://my-bucket/recall"
    )


@pytest.mark.concurrency
@pytest.mark.parametrize("name", ["RECALL_DATASET_URI", "RECALL_OUTPUT_URI"])
def test_the_guard_stops_the_deploy_when_a_value_is_empty(checkout: Path, name: str) -> None:
    block = deploy_block()
    emptied = re.sub(rf"^export {name}=\S+", f'export {name}="$UNSET_IN_THIS_SHELL"', block, flags=re.M)
    assert emptied != block
    done = fresh_bash(emptied, checkout)
    assert done.returncode != 0 and f"{name}: parameter null or not set" in done.stderr, done.stderr
    assert "prefect" not in done.stdout  # the deploy never ran
