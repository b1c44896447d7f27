"""A newcomer's first minute: a fresh clone to the demo's printed summary, with no package caches.

Each trial clones this repository at a commit into a temporary folder and runs ``make demo`` there with empty
package caches (a new ``UV_CACHE_DIR``, ``PIP_NO_CACHE_DIR``) and a new state directory, so the local Prefect
server boots for the first time too. Printed per trial: the install ``make demo`` does first (its runtime
install step, or ``make venv`` in a Makefile without one), the demo (``recall-bench demo``, the server's first
boot included) and the total. With ``--vs`` two commits alternate, trial by trial.

    python benchmarks/first_contact.py --commit HEAD --vs 60987c1 --trials 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def trial(commit: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="first-contact-") as tmp:
        base = Path(tmp)
        clone = base / "clone"
        subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", commit], check=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "UV_", "VIRTUAL_ENV"))}
        env |= {
            "UV_CACHE_DIR": str(base / "uv-cache"),
            "PIP_NO_CACHE_DIR": "1",
            "RECALL_BENCH_STATE_DIR": str(base / "state"),
            "XDG_CACHE_HOME": str(base / "cache"),
        }
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # a user's first run writes bytecode
        # what `make demo` installs first: the runtime set where the Makefile has that step, else everything
        makefile = (clone / "Makefile").read_text()
        install = ".venv/.installed-runtime" if "RUNTIME_STAMP" in makefile else "venv"
        started = time.perf_counter()
        subprocess.run(["make", install], cwd=clone, env=env, check=True, capture_output=True)
        installed = time.perf_counter()
        demo = subprocess.run(["make", "demo"], cwd=clone, env=env, capture_output=True, text=True)
        finished = time.perf_counter()
        subprocess.run([str(clone / ".venv" / "bin" / "recall-bench"), "server", "stop"], env=env, capture_output=True)
        if demo.returncode != 0 or "│ status            │ completed" not in demo.stdout:
            raise SystemExit(f"the demo at {commit} failed:\n{demo.stdout}\n{demo.stderr}")
        return {"install_s": installed - started, "demo_s": finished - installed, "total_s": finished - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--vs", help="a second commit, alternated with --commit trial by trial")
    parser.add_argument("--trials", type=int, default=2)
    args = parser.parse_args()
    commits = [args.commit] + ([args.vs] if args.vs else [])

    def short(commit: str) -> str:
        git = ["git", "-C", str(ROOT), "rev-parse", "--short", commit]
        return subprocess.run(git, capture_output=True, text=True, check=True).stdout.strip()

    resolved = {c: short(c) for c in commits}
    results: dict[str, list[dict[str, float]]] = {c: [] for c in commits}
    for i in range(args.trials):
        for commit in commits:
            figures = trial(commit)
            results[commit].append(figures)
            print(
                f"trial {i + 1} {resolved[commit]}: install {figures['install_s']:.1f} s, "
                f"demo {figures['demo_s']:.1f} s, total {figures['total_s']:.1f} s",
                flush=True,
            )
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    print("| commit | install | demo (first server boot included) | fresh clone to summary |")
    print("|---|---|---|---|")
    for commit in commits:
        med = {k: statistics.median(r[k] for r in results[commit]) for k in ("install_s", "demo_s", "total_s")}
        print(f"| `{resolved[commit]}` | {med['install_s']:.0f} s | {med['demo_s']:.0f} s | {med['total_s']:.0f} s |")


if __name__ == "__main__":
    main()
