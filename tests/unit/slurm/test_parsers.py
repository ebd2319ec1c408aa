"""The access layer's pure parsers, on output recorded from the real Slurm 22.05."""

from pathlib import Path

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.slurm import compress_hostlist, expand_hostlist
from slurm_robust.slurm.client import check_job_id, check_node_name, clean_reason
from slurm_robust.slurm.records import (
    SlurmParseError,
    parse_sacct_parsable,
    parse_scontrol_oneliner,
    parse_sinfo_json,
    parse_squeue_json,
)

DATA = Path(__file__).resolve().parents[2] / "data"


def test_sinfo_json_gives_state_flags_and_reason():
    nodes = {n.name: n for n in parse_sinfo_json((DATA / "sinfo_22.05.json").read_text())}
    assert nodes["node1"].state == "idle" and nodes["node1"].idle
    drained = nodes["node3"]
    assert drained.drained and not drained.usable
    assert drained.reason == "slurm_robust: gpu_xid: Xid 79 on GPU 3"
    assert drained.reason_user == "root"
    assert drained.partitions == ("train",)


def test_squeue_json_expands_nodes():
    job = parse_squeue_json((DATA / "squeue_22.05.json").read_text())[0]
    assert job.job_id == "1" and job.nodes == ("node1", "node2") and job.node_count == 2
    assert job.finished and job.state == "COMPLETED"


def test_sacct_parsable():
    rows = parse_sacct_parsable((DATA / "sacct_22.05.txt").read_text())
    assert [r.job_id for r in rows] == ["1", "2", "3"]
    assert rows[0].nodes == ("node1", "node2") and rows[0].exit_code == "0:0"
    assert rows[1].elapsed_s == 30


def test_sacct_wrong_field_count_is_a_clear_error():
    with pytest.raises(SlurmParseError, match="3 fields, expected"):
        parse_sacct_parsable("1|a|b\n")


def test_non_json_output_is_a_clear_error():
    with pytest.raises(SlurmParseError, match="did not print JSON"):
        parse_sinfo_json("sinfo: error: something")


def test_scontrol_oneliner_keeps_spaces_in_values():
    line = ("NodeName=node3 State=IDLE+DRAIN OS=Linux 6.1 #1 SMP Partitions=train "
            "Reason=disk full on /tmp [root@2026-11-29T08:15:38]")
    d = parse_scontrol_oneliner(line)
    assert d["State"] == "IDLE+DRAIN" and d["Partitions"] == "train"
    assert d["Reason"] == "disk full on /tmp [root@2026-11-29T08:15:38]"
    assert d["OS"] == "Linux 6.1 #1 SMP"


@pytest.mark.parametrize("expr,names", [
    ("node[1-3],spare1", ["node1", "node2", "node3", "spare1"]),
    ("n[01-03]", ["n01", "n02", "n03"]),
    ("a[1,3-4]b", ["a1b", "a3b", "a4b"]),
    ("", []),
    ("(null)", []),
])
def test_expand_hostlist(expr, names):
    assert expand_hostlist(expr) == names


@pytest.mark.parametrize("names", [
    ["node1", "node2", "node3", "spare1"], ["n01", "n02", "n05"], ["login"], ["x1", "x3"],
])
def test_compress_round_trips(names):
    assert expand_hostlist(compress_hostlist(names)) == names


@pytest.mark.parametrize("bad", ["node[1-", "node]1", "node[3-1]", "node[a-b]"])
def test_bad_hostlists_are_refused(bad):
    with pytest.raises(UsageError):
        expand_hostlist(bad)


def test_job_and_node_names_are_validated_before_any_command():
    assert check_job_id(" 42 ") == "42" and check_job_id("7_3") == "7_3"
    for bad in ["42; rm -rf /", "", "-1", "1 2"]:
        with pytest.raises(UsageError):
            check_job_id(bad)
    with pytest.raises(UsageError):
        check_node_name("node1 state=resume")


def test_reasons_are_one_bounded_line():
    reason = clean_reason("bad\nnode\tstate=resume " + "x" * 500)
    assert "\n" not in reason and "\t" not in reason and len(reason) <= 200
    assert reason.startswith("bad node state=resume")
