"""The package's layers and their import rules (docs/design.md, "Layers"), checked on the source's AST.

Every import counts, the lazy ones inside functions included: a lazy import hides a dependency from a reader,
not from this test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "recall_tasks"

#: Lowest first; a module may import its own layer and the layers before it, never a later one.
LAYERS = ["core", "judges", "metrics", "io", "analysis", "reports", "pipeline", "cli"]
CORE = {"errors", "models", "config", "settings", "summaries", "sentences", "secrets", "_logging", "_sync"}

#: The only modules that import Prefect: the adapter, the event helpers, the fleet rate limits, the command line.
PREFECT_ALLOWED = (
    "recall_tasks.pipeline.flow",
    "recall_tasks.pipeline.events",
    "recall_tasks.pipeline.fleet",
    "recall_tasks.pipeline.fleet_budget",
    "recall_tasks.cli.",
)


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "recall_tasks" or len(parts) == 1:
        return None  # the package's __init__ re-exports the public API from every layer
    if parts[1] in CORE:
        return "core"
    if parts[1] in LAYERS:
        return parts[1]
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports (absolute names), with its line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # ``from recall_tasks.pipeline import steps`` imports the submodule steps
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py"))


def test_every_module_belongs_to_a_layer() -> None:
    homeless = [module_name(p) for p in MODULES if layer_of(module_name(p)) is None]
    assert homeless == ["recall_tasks", "recall_tasks.__main__"]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_imports_follow_the_layers(path: Path) -> None:
    me = module_name(path)
    mine = layer_of(me)
    if mine is None:
        return
    bad = []
    for line, target in imports(path):
        theirs = layer_of(target)
        if theirs is not None and LAYERS.index(theirs) > LAYERS.index(mine):
            bad.append(f"{path.name}:{line} {mine} imports {target} ({theirs})")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_only_the_adapter_events_and_cli_import_prefect(path: Path) -> None:
    me = module_name(path)
    uses = [f"{path.name}:{line} {t}" for line, t in imports(path) if t == "prefect" or t.startswith("prefect.")]
    if me.startswith(PREFECT_ALLOWED):
        return
    assert not uses, f"{me} imports Prefect: {uses}"


def test_the_rules_catch_a_back_edge(tmp_path: Path) -> None:
    """The checker itself: an io module importing the pipeline is reported."""
    probe = PACKAGE / "io" / "storage.py"
    found = [t for _, t in imports(probe)]
    assert "recall_tasks.errors" in found
    fake = tmp_path / "x.py"
    fake.write_text("def f():\n    from recall_tasks.pipeline import steps\n")
    targets = [t for _, t in imports(fake)]
    assert "recall_tasks.pipeline.steps" in targets
    assert LAYERS.index(layer_of("recall_tasks.pipeline.steps") or "") > LAYERS.index("io")
