"""A subcommand whose module fails to import stays visible and fails with its reason."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from slurm_robust.cli import bench, inject, main
from slurm_robust.cli.optional import FeatureUnavailableError, Unavailable, import_optional


@pytest.fixture
def broken_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module that exists but whose dependency is missing."""
    (tmp_path / "sr_broken_feature.py").write_text("import sr_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sr_broken_feature", raising=False)
    return "sr_broken_feature"


def test_import_optional_names_the_failure(broken_module: str) -> None:
    missing = import_optional(broken_module)
    assert isinstance(missing, Unavailable)
    assert "ModuleNotFoundError" in missing.reason and "sr_no_such_dependency" in missing.reason
    absent = import_optional("slurm_robust.no_such_module")
    assert isinstance(absent, Unavailable) and "no_such_module" in absent.reason
    assert not isinstance(import_optional("slurm_robust.errors"), Unavailable)


def test_broken_subcommand_is_listed_and_fails_with_one_line(
        broken_module: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(main.SUBCOMMANDS, "broken", broken_module)
    with pytest.raises(SystemExit) as done:
        main.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "broken" in out and "unavailable:" in out and "sr_no_such_dependency" in out
    assert "bench" in out  # the healthy subcommands are all still there

    code = main.main(["broken", "--any", "args"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1 and err[0].startswith("slurm-robust broken: error: unavailable:")


def test_broken_benchmark_is_listed(broken_module: str, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(bench.BENCHMARKS, "broken", broken_module)
    code = main.main(["bench", "broken"])
    assert code == 1
    assert "unavailable:" in capsys.readouterr().err


def test_inject_families_list_exactly_the_actions_they_register() -> None:
    for modname, actions in inject.FAMILIES.items():
        module = import_optional(modname)
        assert not isinstance(module, Unavailable), module
        sub = argparse.ArgumentParser().add_subparsers()
        module.register(sub)
        assert tuple(sub.choices) == actions, modname


def test_broken_inject_family_keeps_its_actions(broken_module: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inject, "FAMILIES", {broken_module: ("probe", "clear")})
    parser = argparse.ArgumentParser()
    inject.add_arguments(parser)
    args = parser.parse_args(["probe", "--node", "n1"])
    with pytest.raises(FeatureUnavailableError, match="unavailable: .*sr_no_such_dependency"):
        inject.run(args)
