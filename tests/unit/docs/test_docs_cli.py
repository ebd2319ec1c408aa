"""Every ``slurm-robust <subcommand>`` the docs name is a real one, and every option a
doc's command line passes to it is one its parser takes (built in-process, argparse)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from slurm_robust.cli.main import build_parser
from tests.unit.docs.docindex import REPO, blocks, code_spans, doc_files

DOCS = doc_files() + [REPO / "spank" / "README.md"]
IDS = [str(p.relative_to(REPO)) for p in DOCS]
COMMAND = re.compile(r"slurm-robust((?:\s+[^\s`|;&)]+)*)")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its sub-parsers only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _first_choices(parser: argparse.ArgumentParser) -> set[str]:
    """The choices of the first positional argument, if it has any (`cluster ACTION`)."""
    for action in parser._actions:
        if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
            return set(action.choices or ())
    return set()


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


_PARSER: argparse.ArgumentParser | None = None


def parser() -> argparse.ArgumentParser:
    global _PARSER
    if _PARSER is None:
        _PARSER = build_parser()
    return _PARSER


def command_lines(doc: Path) -> list[tuple[int, str]]:
    """Each command line of the doc that runs slurm-robust: inline spans and lines of
    shell blocks (continuations joined)."""
    text = doc.read_text()
    out = [(n, span) for n, span in code_spans(text) if span.startswith("slurm-robust ")]
    for block in blocks(text):
        if block.lang not in ("sh", "bash", "console", "shell", ""):
            continue
        joined = block.body.replace("\\\n", " ")
        lines = joined.splitlines()
        if block.lang == "console":  # commands are the `$ ` lines; the rest is output
            lines = [line[2:] for line in lines if line.startswith("$ ")]
        out.extend((block.line, line) for line in lines if "slurm-robust" in line)
    return out


def check(line: str) -> list[str]:
    problems = []
    for m in COMMAND.finditer(line.split(" -- ")[0].split("#")[0]):
        words = m.group(1).split()
        if not words or words[0].startswith(("-", "<")):  # an option, a placeholder
            continue
        top = _subparsers(parser())
        name = words[0]
        if name not in top:
            problems.append(f"no subcommand {name!r}")
            continue
        sub, rest = top[name], words[1:]
        nested = _subparsers(sub)
        alts = re.fullmatch(r"\{([\w,-]+)\}", rest[0]) if nested and rest else None
        if alts:  # `inject {kill-worker,nan,...} --job J`: each one, options of all
            names = alts.group(1).split(",")
            problems += [f"`{name}` has no subcommand {a!r}" for a in names if a not in nested]
            options = set().union(*(_options(nested[a]) for a in names if a in nested))
            problems += [f"`{name}` takes no option {o.group(1)}" for w in rest[1:]
                         if (o := re.match(r"\[?(--[a-z][\w-]*)", w))
                         and o.group(1) not in options]
            continue
        if nested and rest and re.fullmatch(r"[a-z][\w-]*", rest[0]):
            if rest[0] not in nested:
                problems.append(f"`{name}` has no subcommand {rest[0]!r}")
                continue
            sub, rest = nested[rest[0]], rest[1:]
        choices = _first_choices(sub)
        if not nested and choices and rest and re.fullmatch(r"[a-z][\w-]*", rest[0]) \
                and rest[0] not in choices:  # `cluster up`: a positional with choices
            problems.append(f"`{name}` has no action {rest[0]!r}")
        options = _options(sub)
        for word in rest:
            opt = re.match(r"\[?(--[a-z][\w-]*)", word)
            if opt and opt.group(1) not in options:
                problems.append(f"`{name}` takes no option {opt.group(1)}")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_named_subcommands_and_options_exist(doc: Path) -> None:
    bad = [f"{doc.name}:{n}: {line.strip()}: {p}"
           for n, line in command_lines(doc) for p in check(line)]
    assert not bad, "slurm-robust commands in the doc that the CLI refuses:\n" + "\n".join(bad)


def test_the_checker_refuses_what_the_cli_refuses() -> None:
    assert check("slurm-robust reserve size --nodes 4 --failure-prob 0.1") == []
    assert check("slurm-robust reserve grow") == ["`reserve` has no subcommand 'grow'"]
    assert check("slurm-robust sbumit --nodes 2") == ["no subcommand 'sbumit'"]
    assert check("slurm-robust cluster up --netns") == []
    assert check("slurm-robust cluster start") == ["`cluster` has no action 'start'"]
    assert check("slurm-robust status RUN --jsn") == ["`status` takes no option --jsn"]


def test_console_output_lines_are_not_commands(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("```console\n$ slurm-robust check --no-journal\n"
                   "slurm-robust check: error: site config ...\n```\n")
    assert command_lines(doc) == [(1, "slurm-robust check --no-journal")]
