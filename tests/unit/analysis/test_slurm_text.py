"""Parsers for sacct, sacctmgr events and sinfo -R, on output recorded from the mini-cluster."""

from __future__ import annotations

import json
from datetime import UTC

import pytest

from slurm_robust.analysis.slurm_text import (
    EVENT_FIELDS,
    SACCT_FIELDS,
    collapse_requeues,
    merge_node_events,
    parse_node_events,
    parse_sacct,
    parse_sacct_json,
    parse_sinfo_reasons,
    parse_times,
)

# `SLURM_TIME_FORMAT=%s sacct --parsable2 --duplicates --allusers --format=<SACCT_FIELDS>`
# on the mini-cluster (Slurm 22.05), with one line broken by hand at the end.
SACCT = """\
JobID|JobIDRaw|Partition|State|ExitCode|NNodes|NodeList|Submit|Start|End|ElapsedRaw|JobName
1|1|train|COMPLETED|0:0|2|node[1-2]|1795940128|1795940131|1795940134|3|wrap
1.batch|1.batch||COMPLETED|0:0|1|node1|1795940131|1795940131|1795940134|3|batch
1.0|1.0||COMPLETED|0:0|2|node[1-2]|1795940131|1795940131|1795940131|0|hostname
6|6|train|REQUEUED|0:0|1|node1|1795940354|1795940357|1795940357|0|sbatch
6.batch|6.batch||CANCELLED|0:15|1|node1|1795940357|1795940357|1795940357|0|batch
6|6|train|CANCELLED by 0|0:0|1|None assigned|1795940357|None|1795940417|0|sbatch
7|7|train|COMPLETED|0:0|2|node[1-2]|1795940366|1795940368|1795940371|3|wrap
7.0|7.0||CANCELLED|0:9|2|node[1-2]|1795940368|1795940368|1795940368|0|bash
7.1|7.1||FAILED|3:0|1|node1|1795940368|1795940368|1795940368|0|bash
12|12|train|FAILED|1:0|4|node[1-4]|1795940500|1795940510|1795944110|3600|my|odd|name
13|13|train|NODE_FAIL|0:0|2|node[3-4]|1795940500|1795940510|1795947710|7200|x
14|14|train|FAILED|0:9|1|node1|1795940500|1795940510|1795940520|10|y
this line is broken
"""

EVENTS = """\
node3|1795940138|1795940138|DRAIN|root(0)|test reason x
node3|1795940312|1795940312|DRAIN|root(0)|slurm_robust: gpu_xid: Xid 79 on GPU 3
node4|1795940353|Unknown|DRAIN|root(0)|slurm_robust: test_check: actual 1, expected 0
|1795940000|Unknown||slurm(64030)|Cluster Registered TRES
node9|garbage|Unknown|DOWN|root(0)|x
"""


def test_sacct_splits_jobs_and_steps_with_types():
    jobs, steps = parse_sacct(SACCT)
    assert jobs.malformed == 1 and "broken" in jobs.example
    j = jobs.frame.set_index("job_id", drop=False)
    assert list(jobs.frame["job_id"]) == ["1", "6", "6", "7", "12", "13", "14"]
    assert str(j.loc["12", "state"]) == "FAILED"
    assert j.loc["12", "name"] == "my|odd|name"  # free text last absorbs the separators
    assert int(j.loc["14", "signal"]) == 9 and int(j.loc["12", "exit_code"]) == 1
    assert int(j.loc["13", "nnodes"]) == 2 and j.loc["13", "elapsed_s"] == 7200
    assert j.loc["1", "start"] == 1795940131.0
    cancelled = jobs.frame.iloc[2]
    assert str(cancelled["state"]) == "CANCELLED"  # "CANCELLED by 0"
    assert cancelled["start"] != cancelled["start"]  # None -> NaN
    assert str(jobs.frame["state"].dtype) == "category"
    assert list(steps.frame["step"]) == ["batch", "0", "batch", "0", "1"]
    assert int(steps.frame.iloc[4]["exit_code"]) == 3


def test_sacct_without_header_uses_the_given_fields():
    body = SACCT.split("\n", 1)[1]
    jobs, _ = parse_sacct(body, SACCT_FIELDS)
    assert len(jobs.frame) == 7 and jobs.malformed == 1


def test_collapse_requeues_counts_earlier_records():
    jobs, _ = parse_sacct(SACCT)
    one = collapse_requeues(jobs.frame).set_index("job_raw")
    assert int(one.loc["6", "restarts"]) == 1
    assert str(one.loc["6", "state"]) == "CANCELLED"  # the last record wins
    assert int(one.loc["1", "restarts"]) == 0


def test_iso_times_are_local_time():
    t = parse_times(__import__("pandas").Series(["2026-11-29T08:15:28", "Unknown", None,
                                                 "1795940128"]), tz=UTC)
    assert t.iloc[0] == pytest.approx(1795940128.0)
    assert t.iloc[1] != t.iloc[1] and t.iloc[2] != t.iloc[2]
    assert t.iloc[3] == 1795940128.0


def test_node_events_keep_open_ones_and_count_bad_lines():
    parsed = parse_node_events(EVENTS, EVENT_FIELDS)
    ev = parsed.frame
    assert parsed.malformed == 1  # node9 has no valid start
    assert len(ev) == 4
    assert ev["node"].isna().sum() == 1  # the cluster event
    node4 = ev[ev["node"] == "node4"].iloc[0]
    assert node4["end"] != node4["end"] and node4["kind"] == "drain"
    assert node4["reason"] == "slurm_robust: test_check: actual 1, expected 0"


def test_node_events_with_sacctmgr_header_names():
    text = ("NodeName|TimeStart|TimeEnd|State|User|Reason\n"
            "node3|1795940138|1795940140|DOWN|root(0)|dead\n")
    ev = parse_node_events(text, None).frame
    assert ev.iloc[0]["end"] == 1795940140 and ev.iloc[0]["kind"] == "down"


def test_sinfo_reasons_read_from_both_ends():
    text = ("node3|drained|slurm_robust: a|b reason|root|1795940138\n"
            "spare1|down|Not responding|slurm|1795940200\n"
            "nonsense\n")
    parsed = parse_sinfo_reasons(text)
    assert parsed.malformed == 1
    ev = parsed.frame
    assert list(ev["node"].astype(str)) == ["node3", "spare1"]
    assert ev.iloc[0]["reason"] == "slurm_robust: a|b reason"
    assert list(ev["kind"].astype(str)) == ["drain", "down"]
    assert ev["end"].isna().all()


def test_merge_adds_only_reasons_not_already_open():
    events = parse_node_events(EVENTS, EVENT_FIELDS).frame
    reasons = parse_sinfo_reasons("node4|drained|x|root|1795940353\n"
                                  "node2|drained|y|root|1795940400\n").frame
    merged = merge_node_events(events, reasons)
    assert len(merged) == len(events) + 1
    assert set(merged.loc[merged["source"] == "sinfo", "node"].astype(str)) == {"node2"}


def test_sacct_json_22_05_layout():
    doc = {"jobs": [
        {"job_id": 21, "name": "train", "partition": "train", "nodes": "node[1-2]",
         "allocation_nodes": 2, "state": {"current": "NODE_FAIL", "reason": "None"},
         "exit_code": {"status": "FAILED", "return_code": 0, "signal": {"signal_id": 0}},
         "time": {"submission": 1795940000, "start": 1795940010, "end": 1795943610,
                  "elapsed": 3600}},
        {"name": "no id"}]}
    parsed = parse_sacct_json(json.dumps(doc))
    assert parsed.malformed == 1
    row = parsed.frame.iloc[0]
    assert row["job_id"] == "21" and str(row["state"]) == "NODE_FAIL"
    assert int(row["nnodes"]) == 2 and row["elapsed_s"] == 3600
    assert parse_sacct_json("{not json").malformed == 1
