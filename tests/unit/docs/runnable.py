"""Shell examples the docs mark as runnable, and how their output is compared.

A block is marked by an HTML comment on the line before its opening fence:
``<!-- runnable -->`` (needs nothing but the checkout and its venv) or
``<!-- runnable: cluster -->`` (needs the mini-cluster; run by the integration tests).
Inside a ```console block, a line starting with ``$ `` is a command (bash, from the
repository root, with the venv's bin/ first on PATH); the lines after it, up to the next
command, are its expected output: ``...`` alone matches any number of lines, ``...``
inside a line any text; an example with no lines after it must only succeed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.unit.docs.docindex import REPO, blocks, doc_files

MARK_LOCAL = "runnable"
MARK_CLUSTER = "runnable: cluster"


@dataclass(frozen=True)
class Example:
    doc: Path
    line: int
    command: str
    expected: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


def examples(marker: str) -> list[Example]:
    out = []
    for doc in doc_files():
        for block in blocks(doc.read_text()):
            if block.marker != marker:
                continue
            assert block.lang == "console", \
                f"{doc.name}:{block.line}: a runnable block must be ```console"
            command, expected = None, []
            for line in block.body.splitlines() + ["$ "]:
                if line.startswith("$ "):
                    if command:
                        out.append(Example(doc, block.line, command, tuple(expected)))
                    command, expected = line[2:].strip(), []
                else:
                    expected.append(line.rstrip())
    return out


def _line_matches(pattern: str, line: str) -> bool:
    regex = ".*".join(re.escape(part) for part in pattern.split("..."))
    return re.fullmatch(regex, line) is not None


def matches(expected: tuple[str, ...], actual: list[str]) -> bool:
    """Whole-output match with ``...`` wildcards (lines and within lines)."""
    if not expected:
        return not actual
    head, rest = expected[0], expected[1:]
    if head == "...":
        return any(matches(rest, actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and _line_matches(head, actual[0]) and matches(rest, actual[1:])


def run(example: Example, timeout_s: float = 120.0) -> str | None:
    """None when the example's command succeeds with the shown output, else why not."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(["bash", "-c", example.command], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=timeout_s)
    actual = [line.rstrip() for line in proc.stdout.splitlines()]
    if proc.returncode != 0:
        return (f"{example.id}: `{example.command}` exited {proc.returncode}\n"
                f"{proc.stderr[-2000:]}")
    if example.expected and not matches(example.expected, actual):
        return (f"{example.id}: `{example.command}` printed\n" + "\n".join(actual) +
                "\nbut the doc shows\n" + "\n".join(example.expected))
    return None


def by_block(found: list[Example]) -> list[list[Example]]:
    """The examples grouped by their block, in the doc's order: a block's commands run
    in turn in one test (a later one may read what an earlier one wrote, so they must
    not land on different test processes)."""
    groups: dict[str, list[Example]] = {}
    for example in found:
        groups.setdefault(example.id, []).append(example)
    return list(groups.values())
