"""Incident timings, class/rung tables (with properties), per-node blame and the fleet view."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_robust.analysis import incidents as inc_mod
from slurm_robust.analysis.fleet import cause_table, fleet_view, peak_nodes
from slurm_robust.analysis.frames import records_to_frame
from slurm_robust.analysis.loaders import (
    EVENT_CATEGORIES,
    EVENT_SPECS,
    events_from_records,
    load_health,
    load_verdicts,
)
from slurm_robust.analysis.nodes import node_table, repeat_offenders
from slurm_robust.analysis.pipeline import Inputs, analyse
from slurm_robust.analysis.slurm_text import EVENT_FIELDS, parse_node_events, parse_sacct
from slurm_robust.analysis.taxonomy import CLASS_CATEGORY, CLASSES, RUNGS
from slurm_robust_rehearsal.synth.runs import Fault, synth_run


def _analyse(events):
    return analyse(Inputs(log=events_from_records(events), verdicts=load_verdicts([]),
                          health=load_health([]), node_events=parse_node_events("").frame))


def test_incident_times_are_the_injected_delays():
    f = Fault(4, "nccl_error", "spare", into_step_s=1.0, detect_s=7.0, localize_s=3.0,
              restart_s=20.0, restore_back=1, nodes=("n2",))
    run = synth_run(steps=8, step_time_s=10.0, faults=[f])
    row = _analyse(run.events).incidents.iloc[0]
    assert row["time_to_detect"] == pytest.approx(7.0)
    assert row["time_to_localize"] == pytest.approx(3.0)
    assert row["time_to_recover"] == pytest.approx(3.0 + 20.0 + 10.0)  # incl. first step
    assert row["steps_lost"] == 1 and row["steps_redone"] == 1
    assert row["lost_work_s"] == pytest.approx(10.0)
    assert row["downtime_s"] == pytest.approx(7.0 + 3.0 + 20.0 + 10.0)


def test_stopped_run_counts_downtime_to_its_end():
    run = synth_run(steps=8, faults=[Fault(4, "user_code", "stop", detect_s=2.0, localize_s=None,
                                          restart_s=5.0)])
    row = _analyse(run.events).incidents.iloc[0]
    assert row["time_to_recover"] != row["time_to_recover"]  # never recovered: NaN
    assert row["downtime_s"] == pytest.approx(7.0)


def _incident_frame(pairs):
    recs = [{"run_id": "r", "job_id": None, "attempt": 0, "time": float(i), "incident": f"i{i}",
             "category": CLASS_CATEGORY[c], "class": c, "detected_at": float(i),
             "fault_time": float(i) - d, "recovered_at": float(i) + d, "rung": r}
            for i, (c, r, d) in enumerate(pairs)]
    frame, invalid = records_to_frame(recs, EVENT_SPECS["incident"], EVENT_CATEGORIES)
    assert not invalid.any()
    return frame


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(CLASSES), st.sampled_from(RUNGS),
                          st.floats(0, 1000)), min_size=1, max_size=60))
def test_property_shares_sum_to_one_and_counts_to_total(pairs):
    frame = _incident_frame(pairs)
    frame = frame.assign(time_to_detect=frame["detected_at"] - frame["fault_time"],
                         time_to_localize=float("nan"),
                         time_to_recover=frame["recovered_at"] - frame["detected_at"],
                         lost_time_s=0.0)
    for table in (inc_mod.by_class(frame), inc_mod.by_rung(frame), inc_mod.by_category(frame)):
        assert table["count"].sum() == len(pairs)
        assert table["share"].sum() == pytest.approx(1.0)
    by_class = inc_mod.by_class(frame).set_index("class")
    for cls in set(c for c, _, _ in pairs):
        assert by_class.loc[cls, "count"] == sum(1 for c, _, _ in pairs if c == cls)
        worst = max(d for c, _, d in pairs if c == cls)
        assert by_class.loc[cls, "max_time_to_detect"] == pytest.approx(worst)


def test_empty_incident_tables_have_their_columns():
    frame = _incident_frame([]).iloc[:0]
    table = inc_mod.by_rung(frame)
    assert table.empty and "count" in table.columns and "share" in table.columns


def test_node_table_blame_drains_and_repeat_offenders():
    run = synth_run(steps=20, faults=[Fault(3, "oom", "spare", nodes=("n1",)),
                                      Fault(6, "cuda_error", "spare", nodes=("n1", "n2"))])
    log = events_from_records(run.events)
    events = parse_node_events(
        "n2|100|160|DRAIN|root(0)|x\n"
        "n2|200|Unknown|DOWN|root(0)|y\n"
        "n3|300|400|IDLE|root(0)|not a drain\n", EVENT_FIELDS).frame
    from slurm_robust import records as rec
    health_recs = [rec.make_record(rec.HEALTH_SCHEMA, 1, {
        "node": "n3", "job": None, "stage": "epilog", "run_id": rid, "check": c,
        "status": "fail", "duration_s": 0.1, "reason": "r", "evidence": {},
        "injected": True}, now=50.0) for rid, c in (("a", "x"), ("a", "y"), ("b", "x"))]
    health, _ = records_to_frame(health_recs, __import__(
        "slurm_robust.analysis.loaders", fromlist=["HEALTH_SPEC"]).HEALTH_SPEC)
    table = node_table(log.incidents, load_verdicts([]), health, events, until=300.0)
    assert table.loc["n1", "incidents_blamed"] == 2
    assert table.loc["n2", "incidents_blamed"] == 1
    assert table.loc["n2", "drains"] == 2
    assert table.loc["n2", "time_drained_s"] == pytest.approx(60.0 + 100.0)  # open until 300
    assert table.loc["n3", "checks_failed"] == 3 and table.loc["n3", "check_runs_failed"] == 2
    assert table.loc["n3", "drains"] == 0
    assert sorted(repeat_offenders(table)) == ["n1", "n2", "n3"]
    assert table.index[0] == "n1"  # most blamed first


SACCT = """\
JobID|JobIDRaw|Partition|State|ExitCode|NNodes|NodeList|Submit|Start|End|ElapsedRaw|JobName
1|1|train|COMPLETED|0:0|4|node[1-4]|0|0|86400|86400|a
2|2|train|NODE_FAIL|0:0|2|node[1-2]|0|86400|93600|7200|b
2|2|train|COMPLETED|0:0|2|node[3-4]|93600|93600|97200|3600|b
3|3|train|FAILED|1:0|1|node1|0|100000|103600|3600|c
4|4|train|FAILED|0:9|1|node2|0|100000|101800|1800|d
5|5|train|CANCELLED by 0|0:0|4|node[1-4]|0|200000|203600|3600|e
"""


def test_fleet_view_by_cause_node_hours_and_failure_rate():
    jobs, _ = parse_sacct(SACCT)
    records = jobs.frame
    causes = cause_table(records).set_index("cause")
    assert set(causes.index) == {"NODE_FAIL", "FAILED (exit 1)", "FAILED (signal 9)"}
    assert causes.loc["NODE_FAIL", "node_hours"] == pytest.approx(4.0)
    view = fleet_view(records)
    assert view.jobs == 5 and view.records == 6 and view.requeued_jobs == 1
    assert view.node_hours == pytest.approx(96 + 4 + 2 + 1 + 0.5 + 4)
    assert view.node_hours_lost == pytest.approx(4 + 1 + 0.5)
    assert view.node_failures == 1 and view.failure_source == "NODE_FAIL records"
    assert view.failure_rate_per_node_day == pytest.approx(1 / (107.5 / 24))
    assert view.nodes_in_use == 4
    events = parse_node_events("node1|1|2|DRAIN|root(0)|x\nnode2|1|2|DOWN|root(0)|y\n",
                               EVENT_FIELDS).frame
    assert fleet_view(records, events).node_failures == 2


def test_peak_nodes_back_to_back_jobs_do_not_overlap():
    frame = pd.DataFrame({"start": [0.0, 10.0, 5.0], "end": [10.0, 20.0, 12.0],
                          "nnodes": pd.array([4, 4, 1], dtype="Int64")})
    assert peak_nodes(frame) == 5


def test_fleet_reserve_uses_the_reserve_sizing_rule():
    # 1,024 nodes busy for a day, each failing with p = 0.0012 per day: ByteRobust's 4 spares.
    nodes, rate = 1024, -__import__("math").log(1 - 0.0012)
    failures = round(rate * nodes * 1000)
    text = ("JobID|JobIDRaw|Partition|State|ExitCode|NNodes|NodeList|Submit|Start|End|"
            "ElapsedRaw|JobName\n"
            f"1|1|train|COMPLETED|0:0|{nodes}|n[1-{nodes}]|0|0|86400000|86400000|big\n")
    records = parse_sacct(text)[0].frame
    events = parse_node_events("".join(f"n1|{i + 1}|{i + 2}|DRAIN|root(0)|x\n"
                                       for i in range(failures)), EVENT_FIELDS).frame
    view = fleet_view(records, events)
    assert view.failure_prob_window == pytest.approx(0.0012, rel=1e-3)
    assert view.reserve_size == 4


def test_blame_concentration_counts_incidents_and_distinct_runs_of_the_top_nodes() -> None:
    import pandas as pd

    from slurm_robust.analysis.nodes import blame_concentration

    inc = pd.DataFrame({"run_id": ["a", "a", "b", "c", "d", "e"],
                        "incident": [1, 2, 1, 1, 1, 1],
                        "nodes": [["n1"], ["n1", "n2"], ["n1"], ["n3"], [], ["n2"]]})
    table = blame_concentration(inc, top=(1, 2, 10))
    assert table.to_dict("records") == [
        {"top_nodes": 1, "nodes": "n1", "runs_blaming": 2, "incidents": 3, "share": 0.6},
        {"top_nodes": 2, "nodes": "n1,n2", "runs_blaming": 3, "incidents": 4, "share": 0.8},
        {"top_nodes": 3, "nodes": "n1,n2,n3", "runs_blaming": 4, "incidents": 5,
         "share": 1.0}]
    assert blame_concentration(inc.iloc[4:5]).empty
