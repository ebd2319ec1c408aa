"""Every file, module, function and class README.md and docs/ name exists, and every link
and anchor lands: renaming code without its docs fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.docs.docindex import (
    REPO,
    anchors,
    blocks,
    code_index,
    code_spans,
    doc_files,
    path_components,
    prose,
    resolve_dotted,
    resolve_path,
)

DOCS = doc_files()
IDS = [str(p.relative_to(REPO)) for p in DOCS]

#: File kinds a doc names as part of this repository (anything else with a slash is a
#: runtime path: ``RUN_DIR/state.json``, ``/etc/slurm_robust/config.json``).
SOURCE_SUFFIXES = (".py", ".md", ".yml", ".c", ".h", ".cfg", ".toml", ".lds", ".png",
                   ".jsonl")
#: Characters that mark a placeholder or a pattern, not a path.
PLACEHOLDER = re.compile(r"[<>*{}$%\s|\[\]]|RUN_DIR|\.\.\.")
#: What follows a dot in a file name (`controller.json`), never a member.
FILE_SUFFIXES = {"py", "md", "json", "jsonl", "yml", "lease", "secret", "conf", "so", "c",
                 "h", "png", "html", "txt", "lock", "log"}
#: Names called in docs that are not this project's (Python, torch, Slurm, the shell).
EXTERNAL_CALLS = {
    "state_dict", "load_state_dict", "open", "write", "flock", "fsync", "rename", "kill",
    "os.kill", "backward", "step", "DistributedDataParallel", "async_save", "save", "load",
    "torch.save", "torch.load", "init_process_group", "openat", "getpwnam", "fork",
}


def _path_tokens(span: str) -> list[str]:
    out = []
    for raw in re.split(r"[\s,;()]+", span):
        token = raw.strip("`'\".:")
        if not token or PLACEHOLDER.search(token) or token.startswith(("/", "~", "-")):
            continue
        if not re.fullmatch(r"[\w.\-/]+", token) or "://" in raw:
            continue
        first = token.removeprefix("./").split("/")[0]
        if token.count("/") == 1 and token.endswith("/") and not (REPO / first).is_dir():
            continue  # a bare folder name (`log/`, `run/`) of some runtime tree
        if token.endswith(".py") or ("/" in token and (
                token.endswith(SOURCE_SUFFIXES) or token.endswith("/"))
                and first in path_components()):
            out.append(token)
    return out


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_named_paths_exist(doc: Path) -> None:
    text = doc.read_text()
    missing = [f"{doc.name}:{n}: `{token}`"
               for n, span in code_spans(text) for token in _path_tokens(span)
               if resolve_path(token) is None]
    assert not missing, "paths named in the doc that the repository does not have:\n" + \
        "\n".join(missing)


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_links_and_anchors_land(doc: Path) -> None:
    text = prose(doc.read_text())
    bad = []
    for n, line in enumerate(text.splitlines(), 1):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"\w+://", target) or target.startswith("mailto:"):
                continue
            where, _, anchor = target.partition("#")
            dest = (doc.parent / where).resolve() if where else doc
            if not dest.exists():
                bad.append(f"{doc.name}:{n}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{doc.name}:{n}: {target} (no heading with that anchor)")
    assert not bad, "links that do not land:\n" + "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_named_modules_exist(doc: Path) -> None:
    text = doc.read_text()
    schemas = code_index().schemas
    bad = []
    for n, line in enumerate(text.splitlines(), 1):
        for name in re.findall(r"(?<![\w/])slurm_robust(?:_rehearsal)?(?:\.\w+)+", line):
            name = name.rstrip(".")
            if name in schemas:  # a record schema ("slurm_robust.verdict"), not a module
                continue
            problem = resolve_dotted(name)
            if problem:
                bad.append(f"{doc.name}:{n}: {name}: {problem}")
    assert not bad, "modules and names the docs name that the code lacks:\n" + "\n".join(bad)


def _qualified(span: str) -> tuple[str, str] | None:
    m = re.fullmatch(r"([A-Za-z_]\w*)\.([A-Za-z_]\w*)(?:\(.*\))?", span.strip())
    return (m.group(1), m.group(2)) if m else None


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_named_functions_and_classes_exist(doc: Path) -> None:
    """```Class.member```, ```module.name``` and ```name()``` where the first part is
    this project's (a class or a module's short name): the member must exist."""
    index = code_index()
    bad = []
    spans = list(code_spans(doc.read_text()))
    for block in blocks(doc.read_text()):
        if block.lang == "python":
            spans.extend((block.line, m.group(0)) for m in
                         re.finditer(r"\b[A-Za-z_]\w*\.[A-Za-z_]\w*(?=\()", block.body))
    for n, span in spans:
        q = _qualified(span)
        if q is not None:
            owner, member = q
            called = "(" in span
            if owner == "slurm_robust" or member in FILE_SUFFIXES:
                continue  # a record schema (test_named_modules_exist) or a file name
            if owner in index.classes and owner not in index.short:
                if member not in index.classes[owner]:
                    bad.append(f"{doc.name}:{n}: `{span}`: class {owner} has no {member}")
            elif owner in index.short and (called or member[:1].isupper()):
                # `policy.decide()`, `ckpt.CheckpointManager`; a lower-case name without a
                # call is as often a config key or a record field (`reserve.verdict_dir`).
                modules = index.short[owner]
                if not any(member in index.top[m] or f"{m}.{member}" in index.top
                           or member in index.classes for m in modules):
                    bad.append(f"{doc.name}:{n}: `{span}`: no module {owner} "
                               f"({', '.join(sorted(modules))}) defines {member}")
            continue
        m = re.fullmatch(r"([A-Za-z_]\w*)\(.*\)", span.strip())
        if m and m.group(1) not in EXTERNAL_CALLS and m.group(1) not in index.defined:
            bad.append(f"{doc.name}:{n}: `{span}`: nothing in the package defines "
                       f"{m.group(1)}")
    assert not bad, "functions and classes named in the doc that the code lacks:\n" + \
        "\n".join(bad)
