"""The installed packages' import graph has no cycles, lazy imports included, and the
library never imports the rehearsal tooling.

The checkout holds two distributions: the library (setup.cfg at the root) and its
rehearsal tooling (rehearsal/setup.cfg: the mini-cluster, fault injection, benchmarks,
synthetic data, workloads). The graph is built with :mod:`ast` from the source files that
both setup.cfg files install (``package_dir`` maps ``slurm_robust.ckpt`` to ckpt/ and
``slurm_robust.analysis`` to analysis/), so it needs no third-party tool and imports
nothing it inspects.

What counts as an edge ``A -> B`` (both inside the package):

- every ``import`` and ``from ... import`` anywhere in A's file: module level, inside
  functions and methods (lazy imports run as soon as the function does, so a cycle through
  them is a cycle that waits to bite), and inside ``if TYPE_CHECKING:`` blocks. Those never
  run, but a type that two modules need from each other is still a dependency cycle in the
  design; the fix is the same as for a runtime cycle: move the shared piece to a leaf.
- ``from P import name`` points at ``P.name`` when that is a module, else at ``P`` itself
  (the name lives in P's ``__init__``). Importing ``P.name`` does not add an edge to the
  parent package ``P``: Python runs P's ``__init__`` first, but that is a fact of the
  package tree, not a dependency that one module chose.
"""

from __future__ import annotations

import ast
import configparser
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
#: The library's top-level package, and the rehearsal distribution's.
LIBRARY, REHEARSAL = "slurm_robust", "slurm_robust_rehearsal"
#: Top-level package -> the folder of the setup.cfg that installs it.
DISTRIBUTIONS = {LIBRARY: REPO, REHEARSAL: REPO / "rehearsal"}


def package_dirs(dist: str | None = None) -> dict[str, Path]:
    """Package name -> folder, from the setup.cfg of ``dist`` (both when None): the same
    mapping setuptools installs."""
    dirs: dict[str, Path] = {}
    for top, root in DISTRIBUTIONS.items():
        if dist is not None and dist != top:
            continue
        cfg = configparser.ConfigParser()
        cfg.read(root / "setup.cfg")
        mapping: dict[str, Path] = {}
        for line in cfg["options"].get("package_dir", "").strip().splitlines():
            name, _, folder = (part.strip() for part in line.partition("="))
            mapping[name] = root / folder
        for pkg in cfg["options"]["packages"].split():
            # The longest mapped prefix decides where a package's files are (unmapped:
            # the folder of that name beside setup.cfg).
            base = max((k for k in mapping if pkg == k or pkg.startswith(k + ".")), key=len,
                       default=None)
            if base is None:
                dirs[pkg] = root.joinpath(*pkg.split("."))
                continue
            rest = pkg[len(base):].lstrip(".")
            dirs[pkg] = mapping[base].joinpath(*rest.split(".")) if rest else mapping[base]
    return dirs


def module_files(dist: str | None = None) -> dict[str, Path]:
    """Module name -> source file for every module of every installed package (of
    ``dist`` only, when given)."""
    files: dict[str, Path] = {}
    for pkg, folder in package_dirs(dist).items():
        for path in sorted(folder.glob("*.py")):
            files[pkg if path.stem == "__init__" else f"{pkg}.{path.stem}"] = path
    return files


def _imported(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, str]]:
    """(target, name) for every import in the tree; name is "" for plain ``import X``."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ""
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            for alias in node.names:
                yield target, alias.name


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for target, name in _imported(tree, module, path.stem == "__init__"):
            dest = f"{target}.{name}" if name and f"{target}.{name}" in files else target
            # ``import a.b.c`` names a.b.c; fall back to the longest prefix that is a module.
            while dest and dest not in files:
                dest = dest.rpartition(".")[0]
            if dest and dest != module:
                graph[module].add(dest)
    return graph


def components(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[set[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp: set[str] = set()
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.add(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(comp)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One concrete cycle per strongly connected component."""
    return [_one_cycle(graph, comp) for comp in components(graph)]


def _one_cycle(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A concrete cycle through the component's smallest module (breadth-first, shortest)."""
    start = min(comp)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & comp):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if child not in parent:
                    parent[child] = node
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"component without a cycle: {sorted(comp)}")


def feature_of(module: str) -> str:
    """``slurm_robust.<feature>``: a subpackage, or a top-level module (errors, layout)."""
    return ".".join(module.split(".")[:2])


def feature_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    features: dict[str, set[str]] = {}
    for module, targets in graph.items():
        here = feature_of(module)
        features.setdefault(here, set()).update(
            feature_of(t) for t in targets if feature_of(t) != here)
    for targets in list(features.values()):
        for t in targets:
            features.setdefault(t, set())
    return features


def test_package_maps_to_files() -> None:
    files = module_files()
    # The mapping must find the relocated packages, or the graph would silently skip them.
    assert "slurm_robust.ckpt.manager" in files
    assert "slurm_robust.analysis.ettr" in files
    assert "slurm_robust.launcher.control.controller" in files
    assert "slurm_robust_rehearsal.cluster.manager" in files
    assert "slurm_robust_rehearsal.bench.arms.base" in files
    assert len(module_files(LIBRARY)) > 100 and len(module_files(REHEARSAL)) > 30


def test_every_package_folder_is_installed() -> None:
    """A package folder missing from its setup.cfg ``packages`` would not be installed (and
    would be invisible to the graph)."""
    for dist in DISTRIBUTIONS:
        dirs = package_dirs(dist)
        listed = set(dirs.values())
        for folder in set(dirs.values()):
            for init in folder.glob("*/__init__.py"):
                assert init.parent in listed, f"{init.parent} is not in {dist}'s packages"


def test_each_distribution_installs_only_its_own_packages() -> None:
    """The library's setup.cfg lists no rehearsal package and the rehearsal's lists only
    its own, so that installing the library alone leaves the tooling out."""
    lib, reh = package_dirs(LIBRARY), package_dirs(REHEARSAL)
    assert all(p == LIBRARY or p.startswith(LIBRARY + ".") for p in lib), sorted(lib)
    assert all(p == REHEARSAL or p.startswith(REHEARSAL + ".") for p in reh), sorted(reh)
    assert not set(lib.values()) & set(reh.values())


def test_graph_sees_lazy_and_type_checking_imports() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from slurm_robust.errors import UsageError\n"
        "def f():\n    from . import records\n    import slurm_robust.slurm.runner\n")
    targets = {t for t, _ in _imported(tree, "slurm_robust.site_config", False)}
    assert {"slurm_robust.errors", "slurm_robust", "slurm_robust.slurm.runner"} <= targets


def test_cycle_finder_reports_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def _describe(graph: dict[str, set[str]], comps: list[set[str]]) -> str:
    return "\n".join(" -> ".join(_one_cycle(graph, c)) + f"   (component: {sorted(c)})"
                     for c in comps)


def test_no_import_cycles() -> None:
    graph = import_graph()
    bad = components(graph)
    assert not bad, "import cycles (each printed as a -> b -> ... -> a):\n" + _describe(
        graph, bad)


def test_no_cycles_between_features() -> None:
    """Features (health, reserve, ckpt, ...) depend on each other in one direction only: a
    cycle between two packages hides in modules that do not import each other directly
    (health.node_program -> reserve.history, reserve.gate -> health used to be one)."""
    graph = feature_graph(import_graph())
    bad = components(graph)
    assert not bad, "cycles between features:\n" + _describe(graph, bad)


def test_the_library_never_imports_the_rehearsal_distribution() -> None:
    """The mini-cluster, benchmarks, synthetic data, workloads and injection stay out of
    what a node runs: no module of the library imports the rehearsal distribution, at
    module level, lazily or for typing. The CLI reaches it only by name (cli/main.py,
    cli/bench.py, cli/inject.py); the seams production code reads (probe files, fault
    files, environment variables) are the library's own."""
    leaks = []
    for module, path in module_files(LIBRARY).items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for target, name in _imported(tree, module, path.stem == "__init__"):
            full = f"{target}.{name}" if name else target
            if target == REHEARSAL or target.startswith(REHEARSAL + ".") or \
                    full.startswith(REHEARSAL + "."):
                leaks.append(f"{module} -> {full}")
    assert not leaks, "library modules import the rehearsal distribution:\n" + \
        "\n".join(sorted(leaks))


def test_the_rehearsal_check_sees_every_kind_of_import() -> None:
    tree = ast.parse("import slurm_robust_rehearsal.cluster\n"
                     "def f():\n    from slurm_robust_rehearsal.bench import arms\n")
    targets = {t for t, _ in _imported(tree, "slurm_robust.cli.main", False)}
    assert targets == {"slurm_robust_rehearsal.cluster", "slurm_robust_rehearsal.bench"}
