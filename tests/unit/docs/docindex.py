"""What the docs name and what the repository holds, for the doc tests.

The docs are parsed (inline code spans, fenced blocks, links, headings); the code is
looked up with :mod:`ast` and setup.cfg's package mapping, so nothing a doc names is
imported to check that it exists, and a doc is never checked against itself.
"""

from __future__ import annotations

import ast
import configparser
import functools
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def doc_files() -> list[Path]:
    """README.md and every page of docs/ (decision records included)."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language, body, first line number and the marker (the
    ``<!-- ... -->`` comment on the line before its opening fence, if any)."""

    lang: str
    body: str
    line: int
    marker: str


FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!--\s*(.*?)\s*-->\s*$")


def blocks(text: str) -> list[Block]:
    out: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        prev = lines[i - 1] if i else ""
        mark = MARKER.match(prev)
        out.append(Block(m.group(1), "\n".join(lines[i + 1:j]), i + 1,
                         mark.group(1) if mark else ""))
        i = j + 1
    return out


def prose(text: str) -> str:
    """The text with fenced blocks blanked out (line numbers kept)."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            out.append("")
            continue
        out.append("" if inside else line)
    return "\n".join(out)


def code_spans(text: str) -> list[tuple[int, str]]:
    """(line number, content) of every inline code span outside fenced blocks."""
    spans = []
    for n, line in enumerate(prose(text).splitlines(), 1):
        spans.extend((n, m.group(1)) for m in re.finditer(r"`([^`]+)`", line))
    return spans


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", prose(path.read_text()), re.M)}


@functools.cache
def tracked() -> tuple[str, ...]:
    """Every path git tracks, plus every folder above one (with a trailing /)."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    dirs = {str(Path(f).parent) + "/" for f in files for _ in [0]}
    for f in files:
        parts = Path(f).parts
        dirs.update("/".join(parts[:k]) + "/" for k in range(1, len(parts)))
    return tuple(sorted(set(files) | dirs))


@functools.cache
def path_components() -> frozenset[str]:
    """Names of every tracked file and folder: a doc path starting with one is ours."""
    return frozenset(part for p in tracked() for part in Path(p).parts)


def resolve_path(token: str) -> str | None:
    """The tracked path a doc's ``token`` names (from the root, or a unique-enough suffix:
    ``launcher/node/forkserver.py`` is ``slurm_robust/launcher/node/forkserver.py``)."""
    t = token.removeprefix("./")
    want_dir = t.endswith("/")
    for p in tracked():
        if p == t or (want_dir and p == t) or p == t + "/":
            return p
    for p in tracked():
        if p.endswith("/" + t) or (not want_dir and p.endswith("/" + t + "/")):
            return p
    return None


# ---------------------------------------------------------------- the package, by ast

#: The folders of the checkout's two setup.cfg files: the library and its rehearsal
#: tooling (rehearsal/, package slurm_robust_rehearsal).
DISTRIBUTIONS = (REPO, REPO / "rehearsal")


@functools.cache
def module_files() -> dict[str, Path]:
    """Module name -> source file of both distributions, through each setup.cfg's
    package_dir (ckpt/, analysis/; an unmapped package is the folder of its name)."""
    files: dict[str, Path] = {}
    for root in DISTRIBUTIONS:
        cfg = configparser.ConfigParser()
        cfg.read(root / "setup.cfg")
        mapping = {}
        for line in cfg["options"].get("package_dir", "").strip().splitlines():
            name, _, folder = (part.strip() for part in line.partition("="))
            mapping[name] = root / folder
        for pkg in cfg["options"]["packages"].split():
            base = max((k for k in mapping if pkg == k or pkg.startswith(k + ".")), key=len,
                       default=None)
            if base is None:
                folder = root.joinpath(*pkg.split("."))
            else:
                rest = pkg[len(base):].lstrip(".")
                folder = mapping[base].joinpath(*rest.split(".")) if rest else mapping[base]
            for path in folder.glob("*.py"):
                files[pkg if path.stem == "__init__" else f"{pkg}.{path.stem}"] = path
    return files


def _target_names(node: ast.AST) -> set[str]:
    names: set[str] = set()
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    for t in targets:
        for sub in ast.walk(t) if t is not None else ():
            if isinstance(sub, ast.Name):
                names.add(sub.id)
    return names


def _body_names(body: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            names |= _target_names(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for sub in ("body", "orelse", "finalbody"):
                names |= _body_names(getattr(node, sub, []) or [])
            for handler in getattr(node, "handlers", []):
                names |= _body_names(handler.body)
    return names


@dataclass
class CodeIndex:
    top: dict[str, set[str]]          # module -> its top-level names
    classes: dict[str, set[str]]      # class name -> members (all classes of that name)
    defined: set[str]                 # every function, method and class name
    short: dict[str, set[str]]        # last module component -> module names
    schemas: set[str]                 # "slurm_robust.x" strings in the code (record schemas)


@functools.cache
def code_index() -> CodeIndex:
    top: dict[str, set[str]] = {}
    classes: dict[str, set[str]] = {}
    bases: dict[str, set[str]] = {}
    defined: set[str] = set()
    short: dict[str, set[str]] = {}
    schemas: set[str] = set()
    for module, path in module_files().items():
        tree = ast.parse(path.read_text(), filename=str(path))
        top[module] = _body_names(tree.body)
        short.setdefault(module.rsplit(".", 1)[-1], set()).add(module)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defined.add(node.name)
            elif isinstance(node, ast.ClassDef):
                defined.add(node.name)
                members = _body_names(node.body)
                classes.setdefault(node.name, set()).update(members)
                bases.setdefault(node.name, set()).update(
                    b.id for b in node.bases if isinstance(b, ast.Name))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    re.fullmatch(r"slurm_robust\.\w+", node.value):
                schemas.add(node.value)
    # Members inherited from classes of the project.
    for name in list(classes):
        seen, todo = set(), list(bases.get(name, ()))
        while todo:
            base = todo.pop()
            if base in seen or base not in classes:
                continue
            seen.add(base)
            classes[name] |= classes[base]
            todo.extend(bases.get(base, ()))
    return CodeIndex(top, classes, defined, short, schemas)


def resolve_dotted(name: str) -> str | None:
    """None when ``slurm_robust.a.b.C.m`` (or ``slurm_robust_rehearsal.a.b``) exists,
    else what is missing."""
    files = module_files()
    parts = name.split(".")
    k = len(parts)
    while k > 0 and ".".join(parts[:k]) not in files:
        k -= 1
    if k == 0:
        return f"no module {name}"
    module, rest = ".".join(parts[:k]), parts[k:]
    if not rest:
        return None
    index = code_index()
    if rest[0] not in index.top[module]:
        return f"{module} has no {rest[0]!r}"
    if len(rest) > 1 and rest[0] in index.classes and rest[1] not in index.classes[rest[0]]:
        return f"{module}.{rest[0]} has no {rest[1]!r}"
    return None
