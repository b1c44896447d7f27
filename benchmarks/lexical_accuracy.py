"""Accuracy of the offline LexicalJudge on its two labelled sets, through ``recall-bench calibrate``'s code path.

- ``tests/data/lexical_heldout.jsonl`` (64 rows): written after the tuning, never used to change the judge; the
  figure to quote (README). Small: its 95 % interval is about ±9 points.
- ``tests/data/lexical_labelled.jsonl`` (170 rows): the examples the judge was developed against (its tuning set);
  its figure flatters the judge and is shown for comparison only.

Each set is judged as ``recall-bench calibrate SET --judge lexical`` judges it (``pipeline/calibrate.py``: the
run's scoring, then ``analysis/agreement.py``'s figures with 95 % row-bootstrap intervals, seed 0), so this prints
what that command prints, plus the accuracy per category as counts.

The judge stems with ``snowballstemmer`` (Porter2) since the commit after ``4d7254e``; that commit's version of
this script had ``--stemmer snowball``, which measured the swap on the TUNING set only (deciding on the held-out
set would tune the judge on it): the same 142/170 and the same 28 disagreements as the hand-written stemmer.

Usage: ``python benchmarks/lexical_accuracy.py`` (``--wrong`` lists the disagreements).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
from pathlib import Path

from recall_tasks.analysis.agreement import Agreement, Figure
from recall_tasks.analysis.calibration import JudgeCalibration, JudgeSpec
from recall_tasks.config import RunParams
from recall_tasks.fleet.guards import Budget
from recall_tasks.io.labels import LabelledSet, load_labels
from recall_tasks.judges.lexical import LexicalJudge
from recall_tasks.pipeline.calibrate import calibrate_judge

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
SETS = {"held-out": DATA / "lexical_heldout.jsonl", "tuning": DATA / "lexical_labelled.jsonl"}


def labelled(path: Path) -> LabelledSet:
    """The set, each row's category from its ``category``, else from the tuning set's ``note`` (hard paraphrase
    or ordinary)."""
    s = load_labels(str(path))
    notes = [json.loads(line).get("note", "") for line in path.read_text(encoding="utf-8").splitlines() if line]
    rows = [
        r if r.category else dataclasses.replace(
            r, category="hard-paraphrase" if str(notes[r.index]).startswith("hard") else "ordinary")
        for r in s.rows
    ]  # fmt: skip
    return dataclasses.replace(s, rows=rows)


def measure(path: Path) -> JudgeCalibration:
    params = RunParams(dataset_uri=str(path), judge="lexical")
    spec = JudgeSpec("lexical", "lexical")
    return calibrate_judge(spec, params, LexicalJudge(), labelled(path), None, Budget(), resamples=2000, seed=0)


def fig(f: Figure, pct: bool = True) -> str:
    if f.value is None:
        return f"n/a ({f.reason})"
    if pct:
        return f"{f.value:.1%} [{f.low:.1%}, {f.high:.1%}]"
    return f"{f.value:.2f} [{f.low:.2f}, {f.high:.2f}]"


def counts(a: Agreement) -> str:
    c = a.confusion
    return f"{c.tp + c.tn}/{c.units}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wrong", action="store_true", help="list the disagreements")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    sets = SETS
    print(f"LexicalJudge against human labels at commit {commit or 'unknown'}")
    print("95 % intervals: bootstrap over rows, 2000 resamples, seed 0 (recall-bench calibrate's)")
    for name, path in sets.items():
        cal = measure(path)
        a = cal.overall
        print(f"\n{name} set ({path.name}, {a.rows} rows, {a.units} units):")
        print(f"  accuracy  {counts(a)} = {fig(a.accuracy)}")
        print(f"  kappa     {fig(a.kappa, pct=False)}")
        print(f"  TPR       {fig(a.tpr)}   TNR {fig(a.tnr)}")
        for cat, c in cal.by_category.items():
            print(f"  {cat:<18} {counts(c):>7}  {c.accuracy.value:.0%}")
        rest = [r for r in cal.paired if r.category != "hard-paraphrase"]
        right = sum(h == j for r in rest for h, j in zip(r.human, r.judge, strict=True))
        units = sum(len(r.human) for r in rest)
        print(f"  without hard paraphrases: {right}/{units} = {right / units:.1%}")
        if args.wrong:
            for d in cal.disagreements:
                print(f"    [{d.category}] {d.unit[:80]!r}: human {d.human}, judge {d.judge}: {d.reason}")


if __name__ == "__main__":
    main()
