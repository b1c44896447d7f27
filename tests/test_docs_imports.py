"""Every package a Python block of README.md or docs/ imports is installed by the README's first command, or the
text before the block names the command that adds it.

``make demo`` installs the runtime set only (``uv sync --inexact`` without the ``dev`` extra); this suite runs in the
``dev`` set, so a block importing a package of an extra (pandas) passes its own test here and fails as written for a
newcomer after ``make demo`` (``ModuleNotFoundError: No module named 'pandas'``). The runtime set is read from
``uv.lock``: recall-bench's dependencies and theirs, with every marker taken (a superset is harmless here).
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_closure(extras: tuple[str, ...] = ()) -> set[str]:
    """The packages ``uv sync`` installs for recall-bench with ``extras`` (none: the runtime set)."""
    packages = {_norm(p["name"]): p for p in tomllib.loads((ROOT / "uv.lock").read_text())["package"]}
    own = packages["recall-bench"]
    todo = list(own.get("dependencies", []))
    for extra in extras:
        todo += own.get("optional-dependencies", {})[extra]
    seen: set[str] = set()
    while todo:
        dep = todo.pop()
        name = _norm(dep["name"])
        if name in seen and not dep.get("extra"):
            continue
        seen.add(name)
        todo += packages[name].get("dependencies", [])
        for extra in dep.get("extra", []):
            todo += packages[name].get("optional-dependencies", {}).get(extra, [])
    return seen


def python_blocks(text: str) -> list[tuple[str, str]]:
    """Each ```python block as (the text from its section's heading to the block, its code)."""
    found = []
    for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
        before = text[: match.start()]
        heading = max(before.rfind("\n#"), 0)
        found.append((before[heading:], match.group(1)))
    return found


def imported(code: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"recall_tasks", "flows"}


def test_every_documented_import_is_installed_or_its_install_is_named() -> None:
    runtime = locked_closure()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    dists = {module: {_norm(d) for d in names} for module, names in packages_distributions().items()}
    checked = 0
    for page in PAGES:
        for before, code in python_blocks(page.read_text()):
            for module in imported(code):
                checked += 1
                provided_by = dists.get(module, {_norm(module)})
                if provided_by & runtime:
                    continue
                offering = [e for e in extras if e != "dev" and provided_by & locked_closure((e,))]
                assert offering, f"{page.name}: `import {module}` is in no extra of pyproject.toml but dev"
                command = f".tools/bin/uv sync --locked --inexact --extra {offering[0]}"
                assert command in before, (
                    f"{page.name}: a block imports {module}, which `make demo` does not install; the text before it "
                    f"must name `{command}`"
                )
    assert checked >= 5


def test_the_runtime_set_is_what_make_demo_installs() -> None:
    """The closure above is the runtime set: the demo's own packages in it, the test tools and pandas not."""
    runtime = locked_closure()
    assert {"prefect", "pyarrow", "duckdb", "deltalake", "pyiceberg", "openai", "aiohttp"} <= runtime
    assert not {"pytest", "pandas", "playwright", "prefect-dask"} & runtime
    assert "pandas" in locked_closure(("pandas",))
