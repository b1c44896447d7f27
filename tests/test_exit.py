"""How a ``recall-bench`` process ends: ``cli.runtime.exit_process``.

A command that succeeded aborted at exit (134, "terminate called without an active exception", a clean-clone
run's ``report latest`` and ``history`` 5 times in ~85 with the other core busy): an Arrow thread still held
buffers read through a Python filesystem when the interpreter's finalization began, and freeing them needs the
GIL. The script below makes that moment certain instead of rare: its Python filesystem's read waits until the
interpreter is finalizing, while the scan runs in a daemon thread.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import io, sys, threading, time

    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    from fsspec.implementations.local import LocalFileSystem

    from recall_tasks.cli.runtime import exit_process

    path = sys.argv[2]
    pq.write_table(pa.table({"x": list(range(100))}), path)
    reading, armed = threading.Event(), threading.Event()

    class UntilExit(io.BytesIO):  # a slow store: once armed, answers only when the process is on its way out

        def _wait(self):
            if armed.is_set():
                reading.set()
                while not sys.is_finalizing():
                    time.sleep(0.01)

        def read(self, *args):
            self._wait()
            return super().read(*args)

        def readinto(self, b):
            self._wait()
            return super().readinto(b)

    class Store(LocalFileSystem):
        def _open(self, path, mode="rb", **kwargs):
            with open(path, "rb") as f:
                return UntilExit(f.read())

    dataset = ds.dataset(path, filesystem=pafs.PyFileSystem(pafs.FSSpecHandler(Store())), format="parquet")
    class Linger:  # torn down with this module: the finalization lasts a second, the reader wakes inside it
        def __del__(self, sleep=time.sleep):
            sleep(1.0)

    linger = Linger()
    armed.set()
    threading.Thread(target=dataset.to_table, daemon=True).start()
    assert reading.wait(60)
    print("done", flush=True)
    if sys.argv[1] == "exit_process":
        exit_process(0)
    sys.exit(0)
    """
)


@pytest.mark.concurrency
@pytest.mark.parametrize("how", ["exit_process", "sys.exit"])
def test_an_arrow_read_in_flight_at_exit_aborts_sys_exit_but_not_exit_process(how, tmp_path):
    """``exit_process`` exits 0 with an Arrow read through a Python filesystem in flight; ``sys.exit`` is the
    control: the same script aborts in the interpreter's finalization (what the CLI did before)."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, how, str(tmp_path / "a.parquet")], capture_output=True, text=True, timeout=120
    )
    assert done.stdout == "done\n", done.stderr
    if how == "exit_process":
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""
    else:
        assert done.returncode == -6, (done.returncode, done.stderr)  # SIGABRT
