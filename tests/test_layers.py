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
LAYERS = ["core", "judges", "metrics", "io", "analysis", "reports", "fleet", "pipeline", "cli"]
CORE = {
    "errors", "models", "config", "id_params", "settings", "summaries", "sentences", "secrets", "_logging", "_sync",
    "_heap",
}  # fmt: skip

#: The only modules that import Prefect: the adapter, the event helpers, the fleet limits, the command line.
PREFECT_ALLOWED = (
    "recall_tasks.pipeline.flow",
    "recall_tasks.pipeline.events",
    "recall_tasks.fleet.rate",
    "recall_tasks.fleet.budget",
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


def module_name(path: Path, root: Path = PACKAGE.parent) -> str:
    rel = path.relative_to(root).with_suffix("")
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


def import_graph(paths: list[Path], root: Path = PACKAGE.parent) -> dict[str, set[str]]:
    """Module -> the package modules it imports (lazy ones included). ``from pkg import sub`` is an edge to
    ``pkg.sub`` only when ``sub`` is a module; a name that is no module is an edge to the module defining it."""
    names = {module_name(p, root) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        me = module_name(path, root)
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{alias.name}" for alias in node.names]
                targets = [s for s in subs if s in names] or [node.module]
                if len(targets) < len(subs):
                    targets.append(node.module)
            else:
                continue
            for target in targets:
                while target and target not in names:
                    target = target.rpartition(".")[0]
                if target and target != me:
                    edges.add(target)
        graph[me] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or around a circle (strongly connected)."""
    reach: dict[str, set[str]] = {m: set() for m in graph}
    for start in graph:
        todo = list(graph[start])
        while todo:
            m = todo.pop()
            if m not in reach[start]:
                reach[start].add(m)
                todo.extend(graph.get(m, ()))
    groups = {frozenset({m} | {o for o in reach[m] if m in reach[o]}) for m in graph if m in reach[m]}
    return sorted(sorted(g) for g in groups)


def test_no_two_modules_import_each_other() -> None:
    """No import circle, lazy imports included (a circle is two modules that cannot be read or moved apart)."""
    assert circles(import_graph(MODULES)) == []


def test_the_circle_check_finds_a_circle(tmp_path: Path) -> None:
    pkg = tmp_path / "recall_tasks" / "cli"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("def f():\n    from recall_tasks.cli import b\n")
    (pkg / "b.py").write_text("from recall_tasks.cli.a import f\n")
    (pkg / "c.py").write_text("from recall_tasks.cli import a\n")
    assert circles(import_graph(sorted(pkg.glob("*.py")), tmp_path)) == [["recall_tasks.cli.a", "recall_tasks.cli.b"]]
