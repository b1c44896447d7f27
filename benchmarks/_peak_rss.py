"""Run a command and write its peak RSS (and CPU) as JSON: ``python benchmarks/_peak_rss.py OUT.json CMD...``.

Standard library only, so this process stays small. On Linux a child's ``ru_maxrss`` starts from what its parent
held when it forked or exec'd (the kernel keeps the old memory's high-water mark across exec): a ``recall-bench
run`` spawned by a benchmark that generated a dataset would report the benchmark's memory. Spawned from this small
process instead, ``RUSAGE_CHILDREN`` after the wait is the command's own peak (at least this process's ~10 MB).

``PEAK_RSS_EVERY_S=S`` in the environment: the command's resident memory (``VmRSS``) is also read every S seconds,
written as ``rss_trace``: ``[[seconds since the start, MiB], ...]`` (what a peak does not tell: the resident base
between a run's spikes, and whether it creeps as the run goes).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time


def rss_mib(pid: int) -> float | None:
    """``VmRSS`` of ``pid`` in MiB (Linux /proc), None once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def trace(proc: subprocess.Popen, every_s: float, samples: list[list[float]]) -> None:
    t0 = time.monotonic()
    while proc.poll() is None:
        mib = rss_mib(proc.pid)
        if mib is not None:
            samples.append([round(time.monotonic() - t0, 2), round(mib, 1)])
        time.sleep(every_s)


def main() -> int:
    out, cmd = sys.argv[1], sys.argv[2:]
    every = float(os.environ.pop("PEAK_RSS_EVERY_S", "0") or 0)
    samples: list[list[float]] = []
    proc = subprocess.Popen(cmd)
    poller = threading.Thread(target=trace, args=(proc, every, samples), daemon=True) if every > 0 else None
    if poller is not None:
        poller.start()
    code = proc.wait()
    if poller is not None:
        poller.join(every + 1)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    found = {"peak_rss_kb": usage.ru_maxrss, "cpu_s": usage.ru_utime + usage.ru_stime, "exit": code}
    if poller is not None:
        found["rss_trace"] = samples
    with open(out, "w") as fh:
        json.dump(found, fh)
    return code


if __name__ == "__main__":
    sys.exit(main())
