"""``slurm-robust simulate`` end to end on a small fleet, and the sweep outputs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_robust.cli.main import main
from slurm_robust.simulate import sweep
from slurm_robust.simulate.config import byterobust_mix, byterobust_times
from slurm_robust.simulate.engine import SimConfig


def test_cli_writes_summary_and_event_log(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    rc = main(["simulate", "--machines", "128", "--days", "5", "--seed", "2",
               "--spares", "2", "--reserve", "3", "--json", "-o", str(out)])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads((out / "summary.json").read_text())
    assert printed["ettr"] == saved["ettr"] and 0 < saved["ettr"] <= 1
    assert saved["spares"] == 2 and saved["reserve_target_initial"] == 3
    assert (out / "run" / "events.jsonl").stat().st_size > 0
    assert "cumulative ETTR" in (out / "summary.md").read_text()


def test_cli_bad_spares_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", "--machines", "8", "--days", "1", "--spares", "many"])
    assert rc != 0
    assert "--spares 'many'" in capsys.readouterr().err


def test_sweep_table_and_plot(tmp_path: Path) -> None:
    base = SimConfig(machines=100, days=10, mix=replace(byterobust_mix(),
                                                        rate_per_machine_day=0.02),
                     times=byterobust_times(100), seed=1)
    rows = sweep.run_sweeps(base, seeds=1)
    assert {r["sweep"] for r in rows} == {"spares", "requeue_delay", "rungs"}
    no_spare = next(r for r in rows if r["value"] == "no spare")
    oracle = next(r for r in rows if r["value"].startswith("no requeue"))
    assert no_spare["requeues"] >= oracle["requeues"]
    table = sweep.markdown(rows)
    assert table.count("\n") == len(rows) + 2
    sweep.plot(rows, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
