"""The launcher's ``dict[str, Any]`` stay few, and each says why its keys are open.

A ``dict[str, Any]`` says nothing about its keys; where they are fixed (a record written
to state.json, a summary, an incident's structured evidence) a dataclass or TypedDict
says them. What stays is open-ended: evidence merged from a classifier or a check, a
message's wire form before it is checked, a user's options. Each of those carries a
comment on its line or the line above: ``# open-ended: <why>``.

The spellings are found in the syntax tree (annotations, aliases, casts: anywhere in the
code, string annotations included), not by text, so neither a comment nor a docstring
counts and a ``typing.Dict[str, Any]`` does.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import slurm_robust.launcher
from slurm_robust.launcher.config import RunConfig, RunConfigRecord
from slurm_robust.launcher.control.state import RunState, StateRecord

LAUNCHER = Path(slurm_robust.launcher.__file__).parent
CEILING = 30
# The reason must say something: a few words after the colon.
JUSTIFIED = re.compile(r"open-ended\s*[:\-\u2014]\s*\S.{8,}", re.IGNORECASE)


def _is_name(node: ast.expr, *names: str) -> bool:
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Attribute):  # typing.Dict, t.Any
        return node.attr in names
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in names
    return False


def _spells_open_dict(node: ast.AST) -> bool:
    if not isinstance(node, ast.Subscript) or not _is_name(node.value, "dict", "Dict"):
        return False
    args = node.slice
    return (isinstance(args, ast.Tuple) and len(args.elts) == 2
            and _is_name(args.elts[0], "str") and _is_name(args.elts[1], "Any"))


def _string_annotations(tree: ast.AST) -> list[ast.expr]:
    """Annotations written as strings (``x: "dict[str, Any]"``), parsed, at their line."""
    found: list[ast.expr] = []
    annotations: list[ast.expr | None] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        elif isinstance(node, ast.arg):
            annotations.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            annotations.append(node.returns)
    for ann in annotations:
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            try:
                inner = ast.parse(ann.value, mode="eval").body
            except SyntaxError:
                continue
            for sub in ast.walk(inner):
                ast.copy_location(sub, ann)
            found.append(inner)
    return found


def open_dicts(source: str) -> list[int]:
    """The line of each spelling of ``dict[str, Any]`` in ``source`` (one per spelling)."""
    tree = ast.parse(source)
    lines = [node.lineno for node in ast.walk(tree) if _spells_open_dict(node)]
    for inner in _string_annotations(tree):
        lines += [node.lineno for node in ast.walk(inner) if _spells_open_dict(node)]
    return sorted(lines)


def comments(source: str) -> dict[int, str]:
    """Line -> the comment on it (real comments only: not text inside strings)."""
    out: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string
    return out


def justified(line: int, notes: dict[int, str]) -> bool:
    return any(JUSTIFIED.search(notes.get(n, "")) for n in (line, line - 1))


def scan(root: Path) -> tuple[list[str], list[str]]:
    """(every occurrence, the unjustified ones), each as ``file:line``."""
    every: list[str] = []
    bare: list[str] = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        found = open_dicts(source)
        notes = comments(source) if found else {}
        for line in found:
            where = f"{path.relative_to(root.parent.parent)}:{line}"
            every.append(where)
            if not justified(line, notes):
                bare.append(where)
    return every, bare


def test_the_finder_reads_the_syntax_not_the_text() -> None:
    source = '''
from typing import Any, Dict
import typing
a: dict[str, Any] = {}
b: Dict[str, Any]
c: "dict[str, Any] | None" = None
d: dict[str, str] = {}
E = dict[str, Any]
def f(x: list[dict[str, Any]]) -> typing.Dict[str, typing.Any]: ...
# dict[str, Any] in a comment
"dict[str, Any] in a string"
'''
    assert open_dicts(source) == [4, 5, 6, 8, 9, 9]


def test_a_justification_is_a_reason_on_the_line_or_above() -> None:
    source = '''
# open-ended: classifier evidence, keys vary by rule
a: dict[str, Any] = {}
b: dict[str, Any] = {}  # open-ended: the user's own options

c: dict[str, Any] = {}  # open-ended

x = "# open-ended: not a comment"; d: dict[str, Any] = {}
'''
    notes = comments(source)
    assert [justified(n, notes) for n in open_dicts(source)] == [True, True, False, False]


def test_open_dicts_are_few() -> None:
    every, _ = scan(LAUNCHER)
    assert len(every) <= CEILING, (
        f"{len(every)} spellings of dict[str, Any] in the launcher (ceiling {CEILING}); "
        "give fixed keys a dataclass or TypedDict:\n" + "\n".join(every))


def test_open_dicts_say_why() -> None:
    _, bare = scan(LAUNCHER)
    assert not bare, ("dict[str, Any] without a '# open-ended: <why>' comment on its line "
                      "or the line above:\n" + "\n".join(bare))


def test_records_made_by_asdict_have_their_typeddicts_keys() -> None:
    # RunConfig.to_dict and RunState.to_dict cast asdict's output to a TypedDict: the
    # TypedDict must name every field, in order, and nothing else.
    cfg = RunConfig(command=("python", "train.py"), run_dir="/tmp/run")
    assert list(cfg.to_dict()) == list(RunConfigRecord.__annotations__)
    assert list(RunState().to_dict()) == list(StateRecord.__annotations__)
