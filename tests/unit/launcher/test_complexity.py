"""No function of launcher/control is over cyclomatic complexity 15.

The control code decides what happens to a whole job after a fault; a function with more
paths than a reader can hold is where a wrong branch hides. The count is the usual one,
from the syntax tree: 1, plus one for each if/elif, for, while, except, with, boolean
operator, comprehension condition, match case, assert and conditional expression.
"""

from __future__ import annotations

import ast
from pathlib import Path

import slurm_robust.launcher.control

CONTROL = Path(slurm_robust.launcher.control.__file__).parent
LIMIT = 15

_BRANCHES = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.With,
             ast.AsyncWith, ast.BoolOp, ast.match_case, ast.Assert, ast.IfExp)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def complexity(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The function's own complexity: nested functions are counted on their own."""
    count = 1
    todo: list[ast.AST] = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        if isinstance(node, _FUNCTIONS):
            continue
        if isinstance(node, _BRANCHES):
            count += 1
        elif isinstance(node, ast.comprehension):
            count += len(node.ifs)
        todo.extend(ast.iter_child_nodes(node))
    return count


def complexities(root: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, _FUNCTIONS):
                out[f"{path.name}:{node.lineno} {node.name}"] = complexity(node)
    return out


def test_the_counter_counts_each_kind_of_branch() -> None:
    src = '''
def f(x, ys):
    if x and ys:                              # if, bool-op
        pass
    elif x:                                   # elif
        pass
    for y in ys:                              # for
        while y:                              # while
            y -= 1
    try:
        pass
    except ValueError:                        # except
        pass
    with open("p") as fh:                     # with
        pass
    zs = [y for y in ys if y if y > 1]        # two comprehension conditions
    match x:
        case 1:                               # case
            pass
        case _:                               # case
            pass
    assert x                                  # assert
    return 1 if x else 2                      # ternary

    def inner():                              # counted on its own
        if x:
            pass
'''
    fn = ast.parse(src).body[0]
    assert isinstance(fn, ast.FunctionDef)
    assert complexity(fn) == 1 + 13


def test_no_control_function_is_over_the_limit() -> None:
    over = {name: c for name, c in complexities(CONTROL).items() if c > LIMIT}
    assert not over, f"over cyclomatic complexity {LIMIT}: {over}"
