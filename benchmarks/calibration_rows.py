"""How many labelled rows a calibration needs for a given 95 % interval width (docs/calibration.md's table).

For a judge of accuracy p, judged on n independent units (one labelled sentence per row), the 95 % interval of
the accuracy has a half-width of about ``1.96 × sqrt(p (1 - p) / n)``; so a half-width h needs
``n = 1.96² × p (1 - p) / h²`` rows. This script prints that formula's table, then checks it against what
``recall-bench calibrate`` reports: the mean half-width of its bootstrap interval (``analysis/agreement.py``, rows
resampled) on simulated labelled sets (human labels 60 % supported, the judge right with probability p), and the
same for Cohen's kappa, which has no such simple formula.

Rows with several units: units of one row are correlated (one reference, one context), so k units per row are
worth fewer than k independent rows; count rows, or use the simulation's ``--units-per-row``.

Usage: ``python benchmarks/calibration_rows.py [--sets 40] [--units-per-row 1]``.
"""

from __future__ import annotations

import argparse
import math
import subprocess

import numpy as np

from recall_tasks.analysis.agreement import PairedRow, agreement

Z = 1.959964


def formula_half_width(p: float, n: int) -> float:
    return Z * math.sqrt(p * (1 - p) / n)


def rows_needed(p: float, h: float) -> int:
    return math.ceil(Z * Z * p * (1 - p) / (h * h))


def simulated(p: float, n: int, sets: int, units: int, rng: np.random.Generator) -> tuple[float, float]:
    """Mean bootstrap half-widths (accuracy, kappa) over ``sets`` simulated labelled sets of ``n`` rows.

    With several units per row, a row is "easy" or "hard" for the judge as a whole (correlated errors): the row's
    chance of a right verdict is drawn around p, then each unit is right with that chance.
    """
    acc, kap = [], []
    for s in range(sets):
        rows = []
        for i in range(n):
            human = [bool(h) for h in rng.random(units) < 0.6]
            right = p if units == 1 else float(np.clip(rng.normal(p, 0.15), 0, 1))
            judge = [h if rng.random() < right else not h for h in human]
            rows.append(PairedRow(human, judge, key=str(i)))
        a = agreement(rows, resamples=1000, seed=s)
        acc.append((a.accuracy.high - a.accuracy.low) / 2)  # type: ignore[operator]
        if a.kappa.value is not None:
            kap.append((a.kappa.high - a.kappa.low) / 2)  # type: ignore[operator]
    return float(np.mean(acc)), float(np.mean(kap))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=40, help="simulated sets per cell")
    parser.add_argument("--units-per-row", type=int, default=1)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"calibration rows vs interval width at commit {commit or 'unknown'}")
    print("\nRows needed for a 95 % half-width h of the accuracy (formula, one unit per row):")
    widths = (0.10, 0.05, 0.03, 0.02)
    print("| accuracy | " + " | ".join(f"±{h:.0%}" for h in widths) + " |")
    print("|---|" + "---|" * len(widths))
    for p in (0.8, 0.85, 0.9):
        print(f"| {p:.2f} | " + " | ".join(str(rows_needed(p, h)) for h in widths) + " |")
    rng = np.random.default_rng(0)
    print(
        f"\nHalf-width by rows: formula vs calibrate's bootstrap (mean of {args.sets} simulated sets, "
        f"{args.units_per_row} unit(s) per row, 60 % labelled supported):"
    )
    print("| rows | accuracy | formula | bootstrap | kappa (bootstrap) |")
    print("|---|---|---|---|---|")
    for p in (0.8, 0.9):
        for n in (25, 50, 100, 200, 400, 800):
            acc, kap = simulated(p, n, args.sets, args.units_per_row, rng)
            formula = formula_half_width(p, n * args.units_per_row)
            print(f"| {n} | {p:.1f} | ±{formula:.3f} | ±{acc:.3f} | ±{kap:.3f} |")


if __name__ == "__main__":
    main()
