"""One copy of the shared words: rungs, run statuses and health statuses live in
slurm_robust/vocabulary.py, and the launcher, health checks, analysis, simulator and
synthetic fleet take them from there instead of spelling their own lists."""

from __future__ import annotations

import ast
from pathlib import Path

import slurm_robust
from slurm_robust import vocabulary
from slurm_robust.analysis import taxonomy
from slurm_robust.health import framework
from slurm_robust.launcher import enums

PACKAGE = Path(slurm_robust.__file__).parent
ANALYSIS = Path(taxonomy.__file__).parent
#: Word set -> how many of its words in one literal make it a copy of the vocabulary.
WORDS = {"rungs": (frozenset(vocabulary.RUNGS), 2),
         "run statuses": (frozenset(vocabulary.RUN_STATUSES), 2),
         "health statuses": (frozenset(vocabulary.HEALTH_STATUSES), 3)}


def copies(tree: ast.AST) -> list[tuple[int, str]]:
    """Literal tuples, lists, sets and dict keys that spell out part of a vocabulary
    (``__all__`` names functions, such as health's ``ok``/``warn``/``fail``)."""
    exports = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)}
    found = []
    for node in ast.walk(tree):
        if id(node) in exports:
            continue
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        else:
            continue
        strings = {e.value for e in items if isinstance(e, ast.Constant)
                   and isinstance(e.value, str)}
        for name, (words, least) in WORDS.items():
            if len(strings & words) >= least:
                found.append((node.lineno, name))
    return found


def test_the_launcher_health_and_analysis_use_the_vocabulary() -> None:
    assert enums.Rung is vocabulary.Rung and enums.RunStatus is vocabulary.RunStatus
    assert framework.Status is vocabulary.HealthStatus
    assert taxonomy.RUNGS is vocabulary.RUNGS
    assert taxonomy.RUN_STATUSES is vocabulary.RUN_STATUSES
    assert taxonomy.HEALTH_STATUSES is vocabulary.HEALTH_STATUSES
    assert vocabulary.RUNGS == ("in_place", "spare", "requeue", "stop")
    assert "stood_down" not in vocabulary.RUN_STATUSES  # never in a run_end record


def test_the_copy_finder_sees_a_copy() -> None:
    tree = ast.parse('RUNGS = ("in_place", "spare")\nOK = {"ok": 1, "warn": 2, "fail": 3}\n'
                     'FINE = ("spare", "parked")\n__all__ = ["ok", "warn", "fail"]')
    assert copies(tree) == [(1, "rungs"), (2, "health statuses")]


def test_no_module_spells_its_own_copy() -> None:
    found = []
    for root in (PACKAGE, ANALYSIS):
        for path in sorted(root.rglob("*.py")):
            if path == Path(vocabulary.__file__):
                continue
            for line, name in copies(ast.parse(path.read_text(), str(path))):
                found.append(f"{path.relative_to(root.parent)}:{line}: {name}")
    assert not found, ("spell these with slurm_robust.vocabulary instead:\n" +
                       "\n".join(found))
