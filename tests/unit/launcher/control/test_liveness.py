"""Scripts that report no steps: never hung for silence, judged "no step reports"."""

from __future__ import annotations

import math

from slurm_robust import records as rec
from slurm_robust.analysis.loaders import events_from_records, load_health, load_verdicts
from slurm_robust.analysis.pipeline import Inputs, analyse
from slurm_robust.analysis.slurm_text import parse_node_events
from slurm_robust.launcher.control.events import EventLog
from slurm_robust.launcher.control.policy import is_hung, made_progress
from slurm_robust.launcher.submit.status import format_status, run_status

T0 = 1_000_000.0


def test_silent_script_is_never_hung_however_long():
    # No step ever reported by the run: neither the hang floor nor the startup timeout.
    assert not is_hung(0.0, 1e6, [], 20.0, 10.0, started=False, startup_timeout_s=180.0,
                       reports_steps=False)


def test_startup_timeout_bounds_first_step_of_a_stepping_run():
    assert not is_hung(0.0, 179.0, [], 20.0, 10.0, started=False, startup_timeout_s=180.0,
                       reports_steps=True)
    assert is_hung(0.0, 181.0, [], 20.0, 10.0, started=False, startup_timeout_s=180.0,
                   reports_steps=True)
    # Once the group stepped, the hang timeout applies, whatever reports_steps says.
    assert is_hung(0.0, 21.0, [0.5], 20.0, 10.0, started=True, startup_timeout_s=180.0,
                   reports_steps=False)


def test_status_of_a_run_without_step_reports(tmp_path):
    log = EventLog(tmp_path / "events.jsonl", "r1", "7", 0)
    log.run_start(["n1"], [], 1, {"tp": 1, "pp": 1, "dp": 1}, {})
    log.attempt_start(["n1"], None, None)
    log.run_end("completed", None, None, None)
    s = run_status(str(tmp_path))
    assert s["step_reports"] is False
    text = format_status(s)
    assert "no step reports" in text and "step None" not in text


def _ev(event: str, t: float, **fields):
    return rec.make_record(rec.EVENT_SCHEMA, rec.EVENT_VERSION,
                           {"run_id": "r", "job_id": "7", "attempt": 0, "event": event,
                            **fields}, now=t)


def test_report_has_no_ettr_for_a_run_without_step_reports():
    records = [_ev("run_start", T0, nodes=["n1"]),
               _ev("attempt_start", T0 + 5, restored_step=None),
               _ev("run_end", T0 + 600, status="completed", step=None)]
    an = analyse(Inputs(log=events_from_records(records), verdicts=load_verdicts([]),
                        health=load_health([]), node_events=parse_node_events("").frame))
    row = an.per_run.iloc[0]
    assert row["step_reports"] == 0
    assert math.isnan(row["ettr"])
    assert an.headline()["ettr"] is None or math.isnan(an.headline()["ettr"])


def test_progress_of_a_silent_script_is_judged_by_its_lifetime():
    assert made_progress(3, True, 1.0)
    assert not made_progress(0, True, 1e6)  # a stepping run that stepped no more
    assert not made_progress(0, False, 5.0, silent_progress_s=120.0)  # quick failure
    assert made_progress(0, False, 600.0, silent_progress_s=120.0)
