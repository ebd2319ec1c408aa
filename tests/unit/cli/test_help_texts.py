"""`--help` answers what a newcomer asks: every option says what it does, every command
has a description, and the defaults it shows are the ones the launcher uses."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from slurm_robust.cli.main import build_parser
from slurm_robust.launcher.config import RunConfig


def _children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its sub-parsers only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _walk(parser: argparse.ArgumentParser,
          name: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for child, sub in _children(parser).items():
        yield from _walk(sub, f"{name} {child}")


def _help(parser: argparse.ArgumentParser, option: str) -> str:
    return next(a.help or "" for a in parser._actions if option in a.option_strings)


def test_every_option_has_a_help_text_and_every_command_a_description() -> None:
    """...in plain text: the terminal shows a docstring's reST ``markup`` as it is."""
    missing = []
    for name, parser in _walk(build_parser(), "slurm-robust"):
        missing += [f"{name} {a.option_strings[0]}" for a in parser._actions
                    if a.option_strings and not a.help]
        if not parser.description:
            missing.append(f"{name} (no description)")
        texts = [parser.description or "", *(a.help or "" for a in parser._actions)]
        missing += [f"{name}: reST markup in {t[:40]!r}..." for t in texts if "``" in t]
    assert not missing, "--help says nothing about:\n" + "\n".join(missing)


def test_the_run_options_show_the_launchers_defaults() -> None:
    submit = _children(build_parser())["submit"]
    assert f"default {RunConfig.max_restarts}" in _help(submit, "--max-restarts")
    assert f"default {RunConfig.local_every}" in _help(submit, "--local-every")
    assert f"default {RunConfig.durable_every}" in _help(submit, "--durable-every")
    assert f"default {RunConfig.hang_floor_s:g}" in _help(submit, "--hang-timeout")
    shortfall = _help(submit, "--on-shortfall")
    assert f"{RunConfig.on_shortfall} (the default)" in shortfall
