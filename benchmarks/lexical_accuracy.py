"""Accuracy of the offline LexicalJudge on its two labelled sets, by category, at the current commit.

- ``tests/data/lexical_labelled.jsonl`` (170 rows): the examples the judge was developed against (its tuning set).
- ``tests/data/lexical_heldout.jsonl`` (64 rows): written after the tuning, never used to change the judge; the
  figure to quote. Categories are named in each row.

Usage: ``python benchmarks/lexical_accuracy.py`` (prints a table; ``--wrong`` lists the disagreements).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections import Counter
from pathlib import Path

from recall_tasks.judges.base import JudgeRequest
from recall_tasks.judges.lexical import LexicalJudge

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
SETS = {"tuning": DATA / "lexical_labelled.jsonl", "held-out": DATA / "lexical_heldout.jsonl"}


def category(row: dict) -> str:
    if "category" in row:
        return str(row["category"])
    return "hard-paraphrase" if str(row.get("note", "")).startswith("hard") else "ordinary"


def evaluate(path: Path) -> tuple[Counter, Counter, list[str]]:
    judge = LexicalJudge()
    right, total, wrong = Counter(), Counter(), []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        request = JudgeRequest(
            task=row["task"], question=row["question"], statements=[row["statement"]], evidence=row["evidence"]
        )
        verdict = judge.judge_sync(request).verdicts[0]
        cat = category(row)
        total[cat] += 1
        if verdict.verdict == row["label"]:
            right[cat] += 1
        else:
            wrong.append(f"[{cat}] {row['statement'][:80]!r}: want {row['label']}, got {verdict.reason}")
    return right, total, wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wrong", action="store_true", help="list the disagreements")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"LexicalJudge accuracy at commit {commit or 'unknown'}")
    for name, path in SETS.items():
        right, total, wrong = evaluate(path)
        n, k = sum(total.values()), sum(right.values())
        print(f"\n{name} set ({path.name}): {k}/{n} = {k / n:.1%}")
        for cat in sorted(total):
            print(f"  {cat:<18} {right[cat]:>3}/{total[cat]:<3} {right[cat] / total[cat]:.0%}")
        if args.wrong:
            print("  disagreements:\n    " + "\n    ".join(wrong))


if __name__ == "__main__":
    main()
