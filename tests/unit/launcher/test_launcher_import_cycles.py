"""No import cycles inside slurm_robust.launcher, lazy ones included.

An ast walk of every module of the package: module-level, function-level and
TYPE_CHECKING imports all count as edges (a cycle hidden behind a function-level import
is still a cycle for the reader). Importing a submodule runs its parent package's
``__init__`` too; that implicit edge is not counted (every package would then be in a
cycle with its own children). The whole-package version lives with the other import
checks; this one keeps the launcher honest on its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import slurm_robust.launcher

ROOT = Path(slurm_robust.launcher.__file__).parent
PREFIX = "slurm_robust.launcher"


def module_name(path: Path, root: Path = ROOT, prefix: str = PREFIX) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([prefix, *parts])


def import_graph(root: Path = ROOT, prefix: str = PREFIX) -> dict[str, set[str]]:
    files = {module_name(p, root, prefix): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    pkg = pkg[: len(pkg) - node.level + 1]
                    base = ".".join([*pkg, base]) if base else ".".join(pkg)
                # ``from pkg import mod`` imports the submodule; ``from mod import x`` the module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                           for a in node.names]
            for t in targets:
                while t and t not in files and t.startswith(prefix):
                    t = t.rsplit(".", 1)[0]
                if t in files and t != mod:
                    graph[mod].add(t)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_walk_sees_lazy_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from p import b\n")
    (pkg / "b.py").write_text("def f():\n    from p.a import x\n")
    assert find_cycles(import_graph(pkg, "p")) == [["p.a", "p.b"]]


def test_launcher_has_no_import_cycles() -> None:
    cycles = find_cycles(import_graph())
    assert cycles == [], f"import cycles in slurm_robust.launcher: {cycles}"
