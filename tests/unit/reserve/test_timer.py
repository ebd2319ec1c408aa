"""The reconcile timer: a pass at once, then one per tick; a failed pass never ends it."""

from __future__ import annotations

import json

import pytest

from slurm_robust.reserve.timer import loop, main


class Stop(Exception):
    pass


def test_first_pass_runs_at_once_and_failures_do_not_end_the_loop(capsys) -> None:
    passes = iter([{"ok": False, "error": "slurmctld away"}, {"ok": True, "target": 2}])
    slept: list[float] = []

    def sleep(dt: float) -> None:
        slept.append(dt)
        if len(slept) == 2:
            raise Stop

    with pytest.raises(Stop):
        loop(30.0, None, sleep=sleep, run=lambda _cfg: next(passes))
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["ok"] for x in lines] == [False, True] and slept == [30.0, 30.0]
    assert lines[0]["schema"] == "slurm_robust.reserve_timer" and lines[0]["v"] == 1


def test_once_returns_the_pass_result() -> None:
    assert loop(1.0, None, once=True, run=lambda _c: {"ok": True}) == 0
    assert loop(1.0, None, once=True, run=lambda _c: {"ok": False}) == 1
    with pytest.raises(SystemExit):
        main(["--every", "0"])
