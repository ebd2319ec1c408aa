"""docs/ARCHITECTURE.md's import direction is the code's: the launcher's planes import
one way (submit -> node -> control -> shared leaves), with no exception and no allow-list.
Recovery never imports the controller. Function-level and TYPE_CHECKING imports count
(tests/unit/core's graph)."""

from __future__ import annotations

from tests.unit.core.test_import_graph import import_graph
from tests.unit.docs.docindex import REPO

DOC = REPO / "docs" / "ARCHITECTURE.md"
PACKAGE = "slurm_robust.launcher"
#: Plane -> its rank in the direction; a module may import its own rank or a later one.
ORDER = {"submit": 0, "node": 1, "control": 2, "leaf": 3}


def plane(module: str) -> str | None:
    if module == PACKAGE or not module.startswith(PACKAGE + "."):
        return None  # outside the launcher, or the package's lazy re-exports
    part = module.split(".")[2]
    return part if part in ORDER else "leaf"


def against_the_direction(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    edges = set()
    for module, targets in graph.items():
        here = plane(module)
        for target in targets:
            there = plane(target)
            if here and there and ORDER[there] < ORDER[here]:
                edges.add((module, target))
    return edges


def test_the_doc_states_the_direction() -> None:
    text = " ".join(DOC.read_text().split())
    assert "`submit` -> `node` -> `control` -> shared leaves, with no exception" in text


def test_no_import_goes_against_the_direction() -> None:
    against = sorted(against_the_direction(import_graph()))
    assert not against, ("imports against submit -> node -> control -> leaves (move what "
                         "the planes share to a leaf module of the launcher):\n" +
                         "\n".join(f"{a} -> {b}" for a, b in against))


def test_recovery_never_imports_the_controller() -> None:
    graph = import_graph()
    assert f"{PACKAGE}.control.controller" not in graph[f"{PACKAGE}.control.recovery"]
    assert "Recovery never imports the controller" in " ".join(DOC.read_text().split())


def test_the_direction_check_sees_an_upward_import() -> None:
    graph = {f"{PACKAGE}.control.x": {f"{PACKAGE}.node.y", f"{PACKAGE}.enums"},
             f"{PACKAGE}.submit.z": {f"{PACKAGE}.node.y"}, PACKAGE: {f"{PACKAGE}.submit.z"}}
    assert against_the_direction(graph) == {(f"{PACKAGE}.control.x", f"{PACKAGE}.node.y")}
