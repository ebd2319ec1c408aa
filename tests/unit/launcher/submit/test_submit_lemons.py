"""New submissions skip the node ledger's lemons (sbatch --exclude) unless allowed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slurm_robust.health.lemons import publish
from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.submit import executor as submit_executor
from slurm_robust.launcher.submit.executor import SlurmOptions, submit_run
from slurm_robust.launcher.submit.lemons import exclude_for_submit, merge_exclude, site_lemons


def site_conf(tmp_path: Path, lemons: list[str] | None) -> str:
    path = tmp_path / "lemons.json"
    if lemons is not None:
        publish(path, lemons)
    conf = tmp_path / "site.json"
    conf.write_text(json.dumps({"ledger": {"dir": str(tmp_path / "ledger"),
                                           "lemons_file": str(path)}}))
    return str(conf)


def test_merge_keeps_the_users_list_and_adds_the_lemons_once() -> None:
    assert merge_exclude("node[1-2]", ["node2", "node9"]) == "node1,node2,node9"
    assert merge_exclude(None, []) is None
    assert merge_exclude(None, ["b", "a"]) == "a,b"


def test_lemons_are_excluded_unless_allowed(tmp_path: Path) -> None:
    conf = site_conf(tmp_path, ["node3"])
    assert exclude_for_submit(None, False, conf) == "node3"
    assert exclude_for_submit("node1", False, conf) == "node1,node3"
    assert exclude_for_submit("node1", True, conf) == "node1"


def test_no_lemons_file_yet_is_no_exclusion_and_no_warning(tmp_path: Path) -> None:
    warnings: list[str] = []
    assert site_lemons(site_conf(tmp_path, None), warnings.append) == []
    assert warnings == []


def test_a_planted_lemons_file_cannot_smuggle_options(tmp_path: Path) -> None:
    conf = site_conf(tmp_path, ["node3"])
    (tmp_path / "lemons.json").write_text(json.dumps(
        {"schema": "slurm_robust.lemons", "lemons": ["node3 --uid=0"]}))
    warnings: list[str] = []
    assert exclude_for_submit(None, False, conf, warnings.append) is None
    assert "lemons not excluded" in warnings[0]


class FakeExecutor:
    params: dict[str, Any] = {}

    def __init__(self, folder: str, max_num_timeout: int) -> None:
        pass

    def update_parameters(self, **params: Any) -> None:
        FakeExecutor.params = params

    def submit(self, fn: Any, *args: Any) -> str:
        return "job"


@pytest.mark.parametrize(("allow", "expected"), [(False, "node1,node3"), (True, "node1")])
def test_submit_run_passes_the_exclusion_to_sbatch(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   allow: bool, expected: str) -> None:
    import submitit

    monkeypatch.setattr(submitit, "SlurmExecutor", FakeExecutor)
    cfg = RunConfig(command=("x",), run_dir=str(tmp_path / "run"),
                    site_config=site_conf(tmp_path, ["node3"]))
    assert submit_run(cfg, SlurmOptions(exclude="node1", allow_lemons=allow)) == "job"
    assert FakeExecutor.params["exclude"] == expected


def test_the_python_executor_takes_allow_lemons(tmp_path: Path) -> None:
    ex = submit_executor.RobustExecutor(tmp_path / "run", allow_lemons=True)
    assert ex._params["allow_lemons"] is True
