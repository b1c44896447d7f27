"""The README's journeys run as written: every ```bash block that needs no credentials is run, in README order.

A block that needs something the test cannot give (an OpenAI key, object storage, a Prefect deployment, the
whole test suite) says so in an HTML comment on the line before it, ``<!-- needs: OPENAI_API_KEY, S3 -->``;
every other block runs here with ``bash -euo pipefail`` in a copy of the repository's files (what a fresh clone
holds), after the README's first command, ``make demo``, with no key in the environment. The copy shares this
checkout's installed ``.venv``: the journeys are tested, not the install (``benchmarks/first_contact.py`` times a
real fresh clone). Prefect is the suite's test server (``PREFECT_API_URL``), as the demo's local server would be.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.fixture_scope import module_unless_repeated

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
NEEDS = re.compile(r"^<!-- needs: (.+?) -->$")


def shell_blocks(text: str) -> list[tuple[str | None, str]]:
    """Each ```bash block as (what it needs, or None when it runs anywhere; its code)."""
    blocks: list[tuple[str | None, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```bash":
            before = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
            match = NEEDS.match(before)
            end = lines.index("```", i + 1)
            blocks.append((match.group(1) if match else None, "\n".join(lines[i + 1 : end])))
            i = end
        i += 1
    return blocks


def test_every_block_runs_here_or_says_what_it_needs():
    blocks = shell_blocks(README)
    assert len(blocks) >= 8
    for needs, code in blocks:
        if needs is None:  # runs here: nothing of the outside world in it
            assert not re.search(r"s3://|OPENAI_API_KEY=|PREFECT_API_URL=|--judge openai|make test", code), code
        else:
            assert re.search(r"s3://|OPENAI_API_KEY|PREFECT_API_URL|--judge openai|make test|alerts install", code), (
                f"block marked 'needs: {needs}' needs nothing this test lacks:\n{code}"
            )
    runnable = "\n".join(code for needs, code in blocks if needs is None)
    assert "make demo-regression" in runnable and "recall-bench history" in runnable


def flow_deployment_names() -> set[str]:
    """``flow/deployment`` of every deployment in deployments/prefect.yaml (the flow named by its entrypoint)."""
    sys.path.insert(0, str(ROOT))
    try:
        import flows.recall_flow as entry
    finally:
        sys.path.remove(str(ROOT))
    spec = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    names = set()
    for deployment in spec["deployments"]:
        function = deployment["entrypoint"].rsplit(":", 1)[1]
        names.add(f"{getattr(entry, function).name}/{deployment['name']}")
    return names


def test_start_a_deployment_now_names_real_deployments():
    """`prefect deployment run 'flow/deployment'` in README and docs: a pair prefect.yaml deploys, with the venv's
    prefect (bare `prefect` is not on PATH after `make`)."""
    known = flow_deployment_names()
    assert "recall-benchmark/nightly-recall" in known
    shown = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for prefix, name in re.findall(r"(\S*)prefect deployment run '([^']+)'", page.read_text()):
            shown.append(name)
            assert prefix == ".venv/bin/", f"{page.name}: {prefix}prefect deployment run '{name}'"
            assert name in known, f"{page.name} starts {name!r}; prefect.yaml deploys {sorted(known)}"
    assert len(shown) >= 3
    # every command line of a README block calls prefect and recall-bench from the venv
    for _, code in shell_blocks(README):
        for line in code.splitlines():
            assert not re.match(r"\s*(prefect|recall-bench) ", line), line


@pytest.fixture(scope=module_unless_repeated)
def clone(tmp_path_factory) -> Path:
    """The repository's tracked files copied (mtimes kept), sharing this checkout's .venv and .tools."""
    target = tmp_path_factory.mktemp("fresh-clone") / "recall-bench"
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    (target / ".venv").symlink_to(ROOT / ".venv")
    (target / ".tools" / "bin").mkdir(parents=True)
    uv = ROOT / ".tools" / "bin" / "uv"
    (target / ".tools" / "bin" / "uv").symlink_to(uv if uv.exists() else sys.executable)
    for name in ("pyproject.toml", "uv.lock"):  # older than the venv's stamps: make installs nothing
        os.utime(target / name, (0, 0))
    return target


def test_readme_journeys_run_as_written(prefect_harness, clone):
    from prefect.settings import PREFECT_API_URL

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AWS_", "RECALL_"))}
    env["PREFECT_API_URL"] = str(PREFECT_API_URL.value())

    def bash(code: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", code], cwd=clone, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"{code}\n--- exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    demo = bash("make demo")  # the README's first command
    assert "│ status            │ completed" in demo.stdout
    outputs = [bash(code) for needs, code in shell_blocks(README) if needs is None]

    # Read the results: the demo's run, queried, exported for scripts and reported
    assert len((clone / "scores.jsonl").read_text().splitlines()) == 12
    reports = list(clone.glob("2*Z-*.html"))  # report latest --to .
    assert len(reports) == 1 and "Contextual recall" in reports[0].read_text()

    # Catch regressions: two index versions offline, the second regressed, the threshold beside the flips
    regression = next(done for done in outputs if "index v2" in done.stdout)
    verdict = re.search(r"^vs baseline (\S+): regressed \(mean delta -0\.\d+, .*at threshold 0\.5.*\)$",
                        regression.stdout, re.M)  # fmt: skip
    assert verdict, regression.stdout
    assert re.search(r"│ label\s+│ index-v2\s+│", regression.stdout)
    assert re.search(r"│ moon-1\s+│ 0\.6667\s+│ 0\.0\s+│ -0\.6667\s+│", regression.stdout), regression.stdout
    # its report: the rows that lost most, each with its question
    (report_line,) = re.findall(r"^HTML report: (\S+)$", regression.stdout, re.M)
    drops = Path(report_line).read_text().split("Largest drops", 1)[1].split("</table>", 1)[0]
    assert '<code>moon-1</code><br><span class="muted">When did humans first land on the Moon?</span>' in drops
