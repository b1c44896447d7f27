"""benchmarks/import_floor.py: which imports make the floor of a run's start-up, and the recorder finding them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.import_floor import RECORDER, packages_before


def test_the_floor_is_third_party_packages_begun_before_the_first_request_and_before_prefect():
    record = {
        "started": [
            (1.0, "json"), (1.1, "yaml"), (1.2, "yaml.constructor"), (1.3, "recall_tasks.config"), (1.4, "_ctypes"),
            (1.5, "nt"), (1.6, "pyarrow"), (2.0, "prefect"), (2.1, "numpy"), (3.0, "late"),
        ],
        "loaded": ["json", "late", "numpy", "prefect", "pyarrow", "recall_tasks", "yaml", "yaml.constructor"],
    }  # fmt: skip
    # nt never loaded (a failed import), json is the standard library, prefect's start is the cut
    assert packages_before(record, first_request_at=2.5) == ["yaml", "pyarrow"]
    assert packages_before(record, first_request_at=1.55) == ["yaml"]
    without_prefect = {**record, "started": [s for s in record["started"] if s[1] != "prefect"]}
    assert packages_before(without_prefect, first_request_at=2.5) == ["yaml", "pyarrow", "numpy"]


@pytest.mark.concurrency
def test_the_recorder_writes_each_import_start_and_the_loaded_modules_at_exit(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(RECORDER)
    out = tmp_path / "imports.json"
    code = "import time, yaml; t = time.time(); import fractions; print(t)"
    done = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": str(tmp_path), "IMPORT_FLOOR_OUT": str(out)},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    between = float(done.stdout)
    record = json.loads(out.read_text())
    started = {name: t for t, name in reversed(record["started"])}  # each name's first start
    assert started["yaml"] < between < started["fractions"]
    assert {"yaml", "fractions"} <= set(record["loaded"])
    assert packages_before(record, first_request_at=between) == ["yaml"]
