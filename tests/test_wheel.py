"""The package a user installs: the wheel, built from this tree, in a fresh virtual environment outside the repository.

Only the source tree ever ran the package data (the sample, the prompts), the console script and the deployments'
entrypoint; a file left out of the wheel would pass every other test. Here the wheel is installed with the locked
runtime dependencies (``uv export --locked``: the versions and hashes of ``uv.lock``, not whatever PyPI has today)
into a venv in a temporary folder, then run from another temporary folder with no ``PYTHONPATH``: ``recall-bench
demo`` and the flow behind the deployments' entrypoint, as a Prefect worker loads it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def uv_binary() -> str:
    """The uv that ``make venv`` bootstrapped into ``.tools/`` (pinned in the Makefile), else one on PATH."""
    pinned = ROOT / ".tools" / "bin" / "uv"
    found = str(pinned) if pinned.exists() else shutil.which("uv")
    if found is None:
        pytest.fail("uv is missing: `make venv` installs the pinned uv into .tools/")
    return found


def uv(*args: str, cwd: Path = ROOT) -> str:
    """Run the pinned uv. Not with ``make``'s UV_COMPILE_BYTECODE: compiling every module of the fresh venv's
    packages (Prefect, pyarrow...) cost the fixture ~40 s of CPU (setup 103 s instead of 24 s on 2 shared cores);
    the demo compiles what it imports and the second process reads it (``clean_env``)."""
    dropped = ("UV_PROJECT", "UV_COMPILE_BYTECODE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)} | {"UV_PYTHON_DOWNLOADS": "never"}
    done = subprocess.run([uv_binary(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"uv {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory) -> Path:
    """The venv's python, with the wheel and the locked runtime dependencies (no dev extras) installed."""
    base = tmp_path_factory.mktemp("wheel")
    uv("build", "--wheel", "--out-dir", str(base / "dist"), "--quiet")
    (wheel,) = (base / "dist").glob("recall_bench-*.whl")
    requirements = base / "requirements.txt"
    uv("export", "--locked", "--no-emit-project", "--no-dev", "--format", "requirements-txt", "-o", str(requirements))
    venv = base / "venv"
    uv("venv", str(venv), "--python", sys.executable, "--quiet")
    python = venv / "bin" / "python"
    uv("pip", "install", "--quiet", "--python", str(python), "--require-hashes", "-r", str(requirements))
    uv("pip", "install", "--quiet", "--python", str(python), "--no-deps", str(wheel))
    uv("pip", "check", "--python", str(python))  # the locked set satisfies the wheel's own metadata
    return python


def clean_env(tmp_path: Path) -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    drop = ("PYTHONPATH", "VIRTUAL_ENV", "RECALL_OUTPUT", "PYTHONDONTWRITEBYTECODE")  # the 2nd process reuses .pyc
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PREFECT_API_URL"] = str(PREFECT_API_URL.value())
    env["HOME"] = str(tmp_path)  # no user config of the developer's leaks in
    return env


def test_the_wheel_runs_the_demo_from_outside_the_repository(installed_wheel, prefect_harness, tmp_path):
    env = clean_env(tmp_path)
    where = subprocess.run(
        [str(installed_wheel), "-c", "import recall_tasks, importlib.metadata as m; "
         "print(recall_tasks.__file__); print(m.version('recall-bench'))"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    module_file, version = where.stdout.split()
    assert "site-packages" in module_file and not module_file.startswith(str(ROOT)), module_file
    import tomllib

    assert version == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

    demo = subprocess.run(
        [str(installed_wheel.parent / "recall-bench"), "demo"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "│ status            │ completed" in demo.stdout
    assert "│ scored            │ 11" in demo.stdout  # the bundled sample (package data) was read: 12 rows, 1 skipped
    assert (tmp_path / "recall-output" / "results" / "_delta_log").is_dir()
    assert list((tmp_path / "recall-output" / "reports").glob("*.html"))  # the HTML report's template came along


def test_the_deployments_entrypoint_runs_the_flow_from_the_wheel(installed_wheel, prefect_harness, tmp_path):
    """A worker's working directory holds ``flows/recall_flow.py`` (the pull step); the library comes from the wheel."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    deployments = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())["deployments"]
    entrypoints = sorted({d["entrypoint"] for d in deployments})
    assert "flows/recall_flow.py:recall_benchmark" in entrypoints, entrypoints
    workdir = tmp_path / "worker"
    (workdir / "flows").mkdir(parents=True)
    shutil.copy(ROOT / "flows" / "recall_flow.py", workdir / "flows" / "recall_flow.py")
    data = tmp_path / "data" / "nightly.parquet"
    data.parent.mkdir()
    pq.write_table(
        pa.table(
            {
                "row_id": ["a", "b"],
                "question": ["Where is Paris?", "Who wrote it?"],
                "expected_answer": ["Paris is in France.", "Tolstoy wrote War and Peace."],
                "retrieval_context": [["Paris is the capital of France."], ["An unrelated chunk about tea."]],
            }
        ),
        data,
    )
    script = (
        "import sys\n"
        "from prefect.flows import load_flow_from_entrypoint\n"
        "for other in sys.argv[4:]:\n"  # every deployment's flow loads from the wheel
        "    load_flow_from_entrypoint(other)\n"
        "flow = load_flow_from_entrypoint(sys.argv[1])\n"
        "params = {'dataset_uri': sys.argv[2], 'output_uri': sys.argv[3], 'judge': 'lexical', 'label': 'wheel'}\n"
        "summary = flow(params=params)\n"
        "print(summary['status'], summary['rows'], summary['scored'])\n"
    )
    ran = subprocess.run(
        [str(installed_wheel), "-c", script, "flows/recall_flow.py:recall_benchmark", str(data),
         str(tmp_path / "out"), *entrypoints],
        cwd=workdir, env=clean_env(tmp_path), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.split()[-3:] == ["completed", "2", "2"], ran.stdout
    assert (tmp_path / "out" / "runs" / "_delta_log").is_dir()


@pytest.mark.concurrency
def test_the_lock_matches_pyproject_and_bounds_every_major():
    """``uv.lock`` is what ``pyproject.toml`` asks for (``make lock`` after an edit); every dependency names its
    next major as a bound, except the date-versioned fsspec family."""
    import tomllib

    uv("lock", "--check", "--quiet")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [
        *project["dependencies"],
        *(r for extra in project["optional-dependencies"].values() for r in extra),
    ]
    unbounded = [r for r in requirements if "<" not in r and not r.startswith(("s3fs", "fsspec"))]
    assert not unbounded, f"bound the next major of {unbounded}"
