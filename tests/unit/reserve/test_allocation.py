"""Verdicts are judged against the nodes a job was given (sacct), not its shrunken node
list; nodes Slurm marked DOWN under the job become verdicts of class node_down."""

from __future__ import annotations

import os
from pathlib import Path

from slurm_robust.reserve.allocation import GivenNodes, sacct_nodes
from slurm_robust.reserve.handoff import down_under_job
from slurm_robust.reserve.ledger import JobLedger, load_ledger, save_ledger
from slurm_robust.reserve.verdicts import Verdict, parse_verdicts
from slurm_robust.slurm import Node, SlurmCommandError


class FakeSlurm:
    def __init__(self, sacct: str = "", nodes: dict[str, Node] | None = None,
                 fail: bool = False) -> None:
        self.sacct, self.node_map, self.fail, self.asked = sacct, nodes or {}, fail, 0

    def sacct_raw(self, fields, args=()):
        self.asked += 1
        if self.fail:
            raise SlurmCommandError(["sacct"], 1, "Slurm accounting storage is disabled")
        return self.sacct

    def nodes(self, names):
        return [self.node_map[n] for n in names if n in self.node_map]


def node(name: str, state: str, flags: tuple[str, ...] = ()) -> Node:
    return Node(name, state, frozenset(flags), "Not responding" if state == "down" else "",
                "", 0, ("train",), 2, 0)


def test_sacct_nodes_reads_every_record_of_the_job() -> None:
    slurm = FakeSlurm("node[1-4]\nnode[1-3]\nnode1\nNone assigned\n\nspare2\n")
    assert sacct_nodes(slurm, "37") == {"node1", "node2", "node3", "node4", "spare2"}


def test_a_node_slurm_took_out_of_the_job_is_still_its_own() -> None:
    """node2 went DOWN, Slurm shrank the job to node[1,3]."""
    slurm = FakeSlurm("node[1-3]\n")
    given = GivenNodes(["node1", "node3"], lambda: sacct_nodes(slurm, "37"))
    assert "node1" in given and slurm.asked == 0  # the current list answers first
    rec = (b'{"schema": "slurm_robust.verdict", "v": 1, "job_id": "37", "node": "node2", '
           b'"reason": "node_lost: heartbeat lost 12s", "class": "node_lost"}\n'
           b'{"schema": "slurm_robust.verdict", "v": 1, "job_id": "37", "node": "node9", '
           b'"reason": "x", "class": "node_lost"}\n')
    verdicts, refusals = parse_verdicts(rec, "37", given, 64)
    assert [v.node for v in verdicts] == ["node2"]
    assert refusals[0].node == "node9" and "not in job 37's allocation" in refusals[0].why
    assert slurm.asked == 1 and given.lost() == {"node2"}


def test_without_accounting_only_the_current_list_counts() -> None:
    slurm = FakeSlurm(fail=True)
    given = GivenNodes(["node1"], lambda: sacct_nodes(slurm, "37"))
    assert "node2" not in given and given.error and "accounting" in given.error


def test_nodes_down_under_the_job_become_node_down_verdicts() -> None:
    slurm = FakeSlurm("node[1-4]\n", {"node2": node("node2", "down"),
                                      "node3": node("node3", "idle"),
                                      "node4": node("node4", "down")})
    given = GivenNodes(["node1"], lambda: sacct_nodes(slurm, "37"))
    blamed = [Verdict("37", "node4", "node_lost: heartbeat lost 9s", "node_lost", "i1", {})]
    extra = down_under_job(slurm, "37", given, blamed)  # type: ignore[arg-type]
    assert [(v.node, v.cls) for v in extra] == [("node2", "node_down")]
    assert extra[0].evidence["slurm_state"] == "down"


def test_ledger_round_trip_and_fails_closed(tmp_path: Path) -> None:
    d = tmp_path / "jobs"
    assert load_ledger(d, "37") == JobLedger("37")
    save_ledger(d, JobLedger("37", ["n2", "n1"], ["s1"]))
    assert load_ledger(d, "37") == JobLedger("37", ["n1", "n2"], ["s1"])
    assert os.stat(d).st_mode & 0o777 == 0o700
    (d / "38.json").write_text("{not json")
    broken = load_ledger(d, "38")
    assert broken.broken and broken.drain_room(4) == 0 and broken.spare_room(4) == 0
