"""The reports' look-ups of a few dataset rows (``io/lookup.py``): the right rows, read a batch at a time.

The HTML report reads the retrieval context of its worst rows and the questions of its largest drops back from the
dataset. Reading a whole row group for them was the largest allocation at the end of a 100,000-row run (~150 MB
for a row group of 50,000 rows; issue 42 item 3): the memory test holds a look-up to a small part of its group.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recall_tasks.io.blocks import role_block
from recall_tasks.io.datasets import open_dataset
from recall_tasks.io.lookup import LOOKUP_BATCH_ROWS, read_contexts, read_questions
from recall_tasks.io.storage import StorageConfig

ROOT = Path(__file__).resolve().parents[1]
GROUP_ROWS = 20_000
CONTEXT_BYTES = 1_000


def _write(path: Path, groups: int = 2, context_bytes: int = CONTEXT_BYTES) -> str:
    """``groups`` row groups of :data:`GROUP_ROWS` rows, each row with a retrieval context of ``context_bytes``."""
    n = groups * GROUP_ROWS
    pad = "x" * context_bytes
    table = pa.table({
        "row_id": [f"r{i}" for i in range(n)], "input": [f"question {i}?" for i in range(n)],
        "expected_output": [f"Answer {i}." for i in range(n)],
        "retrieval_context": [[f"chunk {i} {pad}"] for i in range(n)],
    })  # fmt: skip
    pq.write_table(table, path, row_group_size=GROUP_ROWS)
    return str(path)


def test_the_rows_asked_for_across_batches_and_groups(tmp_path):
    """Rows at both ends of a batch and of a group, in any order, and a row past the file's end left out."""
    uri = _write(tmp_path / "rows.parquet")
    ds = open_dataset(uri, StorageConfig.from_options())
    file_uri = ds.files[0].uri
    rows = [GROUP_ROWS + 5, 0, LOOKUP_BATCH_ROWS - 1, LOOKUP_BATCH_ROWS, GROUP_ROWS - 1, 2 * GROUP_ROWS - 1]
    questions = read_questions(ds, [(file_uri, r, f"r{r}") for r in [*rows, 2 * GROUP_ROWS]])
    assert questions == {f"r{r}": f"question {r}?" for r in rows}
    assert read_questions(ds, [(file_uri, 7, "r8")]) == {}  # the row no longer has that id

    one = pq.read_table(uri).slice(LOOKUP_BATCH_ROWS, 1)
    digest = role_block(ds, file_uri, LOOKUP_BATCH_ROWS, one, ds.columns).content_hashes[0]
    contexts = read_contexts(ds, [(file_uri, LOOKUP_BATCH_ROWS, digest), (file_uri, 3, "not its hash")])
    assert contexts == {(file_uri, LOOKUP_BATCH_ROWS): [f"chunk {LOOKUP_BATCH_ROWS} {'x' * CONTEXT_BYTES}"]}


_PEAK = """
import json, sys
import pyarrow as pa
from recall_tasks.io.datasets import open_dataset
from recall_tasks.io.lookup import LOOKUP_BATCH_ROWS, read_contexts
from recall_tasks.io.storage import StorageConfig
ds = open_dataset(sys.argv[1], StorageConfig.from_options())
before = pa.default_memory_pool().max_memory()
read_contexts(ds, [(ds.files[0].uri, int(sys.argv[2]), "any hash")])
print(json.dumps({"before": before, "peak": pa.default_memory_pool().max_memory()}))
"""


@pytest.mark.concurrency  # a subprocess
def test_a_look_up_decodes_a_batch_not_its_row_group(tmp_path):
    """Arrow's peak while reading the last row of a 20,000-row group (~60 MB of questions, answers and ~3 KB
    contexts) stays under a third of the group: ~11 MB (a batch of :data:`LOOKUP_BATCH_ROWS` rows and the column
    chunks' buffers); reading the whole group took more than its size. A fresh process: Arrow's peak cannot be
    reset."""
    uri = _write(tmp_path / "rows.parquet", groups=1, context_bytes=3 * CONTEXT_BYTES)
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK, uri, str(GROUP_ROWS - 1)], cwd=ROOT, capture_output=True, text=True, check=True
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    group_bytes = pq.read_table(uri).nbytes
    assert result["peak"] - result["before"] < group_bytes / 3, (result, group_bytes)
