"""How often the canary's judge-drift check fires (docs/regression.md, "Choosing the canary"), by canary size.

Simulated canaries: ``rows`` rows of ``--units-per-row`` units, human labels 60 % supported. The baseline night's
judge answers each unit right with probability ``--accuracy``. Tonight's judge:

- **same judge, not deterministic**: it re-answers a share ``--noise`` of the units afresh (same accuracy): no
  drift, so every alarm is a false one;
- **drifted**: on top of that noise, a share ``delta`` of the units is answered the wrong way (a judge that got
  ``delta`` worse, e.g. a model changed behind its name).

Each pair of nights goes through the run's own check, ``analysis/drift.judge_drift`` (the per-row unit counts a
run records, a paired bootstrap of the change in accuracy and kappa), and the table gives the share of pairs
flagged. Usage: ``python benchmarks/canary_drift.py [--pairs 200] [--units-per-row 3] [--noise 0.02]``.
"""

from __future__ import annotations

import argparse
import subprocess
from typing import Any

import numpy as np

from recall_tasks.analysis.drift import judge_drift


def night(human: np.ndarray, right: np.ndarray) -> dict[str, Any]:
    """A run row's canary columns from per-unit human labels and whether the judge got each unit right."""
    judge = np.where(right, human, ~human)
    detail = []
    for i in range(human.shape[0]):
        h, j = human[i], judge[i]
        detail.append({"key": f"r{i}", "tp": int((h & j).sum()), "fn": int((h & ~j).sum()),
                       "fp": int((~h & j).sum()), "tn": int((~h & ~j).sum())})  # fmt: skip
    return {"canary_id": "sha256:sim", "canary_detail": detail}


def flagged(rows: int, units: int, accuracy: float, noise: float, delta: float, pairs: int, seed: int) -> float:
    """Share of simulated night pairs the drift check flags."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(pairs):
        human = rng.random((rows, units)) < 0.6
        right = rng.random((rows, units)) < accuracy
        redo = rng.random((rows, units)) < noise
        tonight = np.where(redo, rng.random((rows, units)) < accuracy, right)
        worse = rng.random((rows, units)) < delta
        tonight = np.where(worse, False, tonight)
        drift = judge_drift(night(human, tonight), night(human, right))
        hits += bool(drift is not None and drift.drifted)
    return hits / pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--units-per-row", type=int, default=3)
    parser.add_argument("--accuracy", type=float, default=0.9)
    parser.add_argument("--noise", type=float, default=0.02)
    parser.add_argument("--rows", type=int, nargs="+", default=[30, 50, 100, 200])
    parser.add_argument("--deltas", type=float, nargs="+", default=[0.02, 0.05, 0.10, 0.20])
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(
        f"judge-drift check, {args.pairs} simulated night pairs per cell, {args.units_per_row} units a row, "
        f"accuracy {args.accuracy}, {args.noise:.0%} of units re-answered at random; commit {commit}\n"
    )
    head = ["rows", "same judge (false alarms)", *[f"{d:.0%} worse" for d in args.deltas]]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for i, rows in enumerate(args.rows):
        cells = [
            flagged(rows, args.units_per_row, args.accuracy, args.noise, d, args.pairs, seed=1000 * i + k)
            for k, d in enumerate([0.0, *args.deltas])
        ]
        print(f"| {rows} | " + " | ".join(f"{c:.0%}" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
