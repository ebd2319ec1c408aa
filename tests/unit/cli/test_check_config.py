"""`slurm-robust check` checks the whole site config before it runs a suite, so an admin
finds a misspelt reserve or monitor key on the terminal, not in the first robust job
(whose agents refuse a bad monitor section at start)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_robust.cli.main import main
from slurm_robust.site_config import CONFIG_ENV


def _check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: dict[str, object],
           ) -> int:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"state_dir": str(tmp_path / "state" / "{node}"), **extra}))
    monkeypatch.setenv(CONFIG_ENV, str(config))
    return main(["check", "--node", "n1", "--no-journal"])


@pytest.mark.parametrize(("section", "message"), [
    ({"reserve": {"partiton": "standby"}}, "site config reserve: unknown key(s) ['partiton']"),
    ({"monitor": {"gpu": {"interval": 10}}}, "site config monitor.gpu: unknown key(s)"),
    ({"ledger": {"lemon_blame": 3}}, "site config ledger: unknown key(s) ['lemon_blame']"),
])
def test_a_typo_in_a_later_section_fails_the_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        section: dict[str, object], message: str) -> None:
    assert _check(tmp_path, monkeypatch, section) == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_a_valid_config_runs_the_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code = _check(tmp_path, monkeypatch, {"reserve": {"partition": "standby"},
                                          "monitor": {"gpu": {"interval_s": 10}}})
    out = capsys.readouterr().out
    assert "n1 quick suite" in out and code in (0, 1)
