"""Run a command and write its peak RSS (and CPU) as JSON: ``python benchmarks/_peak_rss.py OUT.json CMD...``.

Standard library only, so this process stays small. On Linux a child's ``ru_maxrss`` starts from what its parent
held when it forked or exec'd (the kernel keeps the old memory's high-water mark across exec): a ``recall-bench
run`` spawned by a benchmark that generated a dataset would report the benchmark's memory. Spawned from this small
process instead, ``RUSAGE_CHILDREN`` after the wait is the command's own peak (at least this process's ~10 MB).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys


def main() -> int:
    out, cmd = sys.argv[1], sys.argv[2:]
    code = subprocess.call(cmd)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(out, "w") as fh:
        json.dump({"peak_rss_kb": usage.ru_maxrss, "cpu_s": usage.ru_utime + usage.ru_stime, "exit": code}, fh)
    return code


if __name__ == "__main__":
    sys.exit(main())
