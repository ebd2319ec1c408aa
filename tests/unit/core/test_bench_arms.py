"""The arms of the comparing benchmarks: every registered arm is an Arm, and the
registry is the one place their names are written."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from slurm_robust_rehearsal.bench import arms as arms_pkg
from slurm_robust_rehearsal.bench import ettr, recovery, update
from slurm_robust_rehearsal.bench.arms import (
    ARMS,
    REGISTRY,
    Arm,
    EttrArm,
    Setup,
    UpdateArm,
    ettr_arms,
    subject,
    update_arms,
)

BENCH = Path(recovery.__file__).parent


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_registered_arm_satisfies_the_protocol(name):
    arm = ARMS[name]
    assert isinstance(arm, Arm)
    assert arm.name == name
    assert isinstance(arm.label, str) and arm.label
    assert isinstance(arm.redone_key, str) and arm.redone_key
    assert isinstance(arm.subject, bool)
    for method in ("missing", "launch", "fault_figures", "speedup_figures"):
        assert callable(getattr(arm, method))
    # Its figures are keyed by strings; the subject is measured against, not sped up.
    figures = arm.fault_figures([1.0], 20)
    assert figures and all(isinstance(k, str) for k in figures)
    assert (arm.speedup_figures([1.0], 20) == {}) == arm.subject
    why = arm.missing(Setup(ft_launcher=None))
    assert why is None or (arm.optional_key and isinstance(why, str))
    assert arm.missing(Setup(ft_launcher="/x/ft_launcher")) is None


def test_one_subject_and_the_benches_arms_come_from_the_registry():
    assert [a.name for a in ARMS.values() if a.subject] == [subject().name]
    assert recovery.ARMS == tuple(REGISTRY)
    assert [a.name for a in ettr_arms()][0] == subject().name
    assert all(isinstance(a, EttrArm) for a in ettr_arms())
    assert update_arms()[0] is subject() and all(isinstance(a, UpdateArm)
                                                  for a in update_arms())
    # The JSON keys an arm reports under are its own: no two arms share one.
    labels = [a.label for a in ARMS.values()]
    assert len(set(labels)) == len(labels)
    assert len({a.update_key for a in update_arms()}) == len(update_arms())


def test_cli_choices_are_the_registry_names():
    p = argparse.ArgumentParser()
    recovery.add_arguments(p)
    assert ",".join(REGISTRY) in p.format_help().replace("\n", " ").replace(" ", "") \
        or all(n in p.format_help() for n in REGISTRY)
    p = argparse.ArgumentParser()
    ettr.add_arguments(p)
    arm_action = next(a for a in p._actions if a.dest == "arm")
    assert list(arm_action.choices) == [*(a.name for a in ettr_arms()), ettr.BOTH]
    assert arm_action.default == subject().name
    assert update.run  # update has no arm option: it runs both of update_arms()


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """Every string literal in ``path`` but docstrings (f-strings' literal parts too) and
    the value of a module-level ``EXECUTABLE`` (a program's name that an arm's may equal,
    as nvidia-resiliency-ext's ft_launcher does)."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and any(
                isinstance(t, ast.Name) and t.id == "EXECUTABLE" for t in node.targets):
            docstrings.add(id(node.value))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings]


def test_the_registry_is_the_only_place_arm_names_are_written():
    registry_file = Path(arms_pkg.__file__)
    names = set(REGISTRY)
    found = []
    for path in sorted(BENCH.rglob("*.py")):
        if path == registry_file:
            continue
        found += [f"{path.relative_to(BENCH)}:{line}: {value!r}"
                  for line, value in _string_constants(path) if value.strip() in names]
    assert not found, "arm names spelled outside the registry:\n" + "\n".join(found)
    # ... and the registry spells each exactly once.
    spelled = [v for _, v in _string_constants(registry_file) if v in names]
    assert sorted(spelled) == sorted(names)
