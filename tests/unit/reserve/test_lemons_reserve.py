"""Lemons in the reserve: never admitted, never handed over; EpilogSlurmctld records each
verdict as a blame in the node ledger, and the reserve's drains and deep checks too."""

from __future__ import annotations

import os
from pathlib import Path

from slurm_robust.errors import SlurmRobustError
from slurm_robust.health.ledger_writer import record_safely
from slurm_robust.health.node_ledger import EventKind, LedgerConfig, NodeEvent, NodeLedger
from slurm_robust.reserve.config import ReserveConfig
from slurm_robust.reserve.executor import Executor
from slurm_robust.reserve.gate import DeepRun
from slurm_robust.reserve.handoff import handle_job_end, job_end_from_env
from slurm_robust.reserve.ledger import JobLedger
from slurm_robust.reserve.plan import DeepCheck, Move, Snapshot, plan_handoff, plan_reconcile
from slurm_robust.reserve.respare import replace_failed_spares
from slurm_robust.reserve.verdicts import Verdict, ensure_verdict_root, write_verdict
from slurm_robust.site_config import SiteConfig
from tests.unit.reserve.test_plan import CFG, NOW, snap, view
from tests.unit.reserve.test_respare import NOW as RESPARE_NOW
from tests.unit.reserve.test_respare import FakeSlurm, Gate, cluster, node

ENV = {"SLURM_JOB_ID": "42", "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": str(os.geteuid()),
       "SLURM_JOB_NODELIST": "node[1-4]", "SLURM_JOB_PARTITION": "train",
       "SLURM_JOB_RESTART_COUNT": "1"}


def with_lemons(s: Snapshot, *names: str) -> Snapshot:
    return Snapshot(s.now, s.nodes, s.partitions, frozenset(names))


def test_a_lemon_is_never_a_fill_candidate() -> None:
    s = snap([view("n1", 1), view("n2", 5)], [])
    assert [a.node for a in plan_reconcile(s, CFG, 1) if isinstance(a, Move)] == ["n1"]
    moves = plan_reconcile(with_lemons(s, "n1"), CFG, 1)
    assert [(a.node, a.dst) for a in moves if isinstance(a, Move)] == [("n2", "standby")]


def test_a_lemon_is_not_even_deep_checked_as_a_candidate() -> None:
    s = with_lemons(snap([view("n1", age_h=None)], []), "n1")
    assert not any(isinstance(a, DeepCheck) for a in plan_reconcile(s, CFG, 1))


def test_a_member_that_became_a_lemon_goes_home() -> None:
    s = with_lemons(snap([view("n1")], [view("s1"), view("s2")]), "s1")
    actions = plan_reconcile(s, CFG, 2)
    home = [a for a in actions if isinstance(a, Move) and a.node == "s1"]
    assert home and home[0].dst == "train" and "a lemon" in home[0].why
    assert [a.node for a in actions if isinstance(a, Move) and a.dst == "standby"] == ["n1"]


def test_a_lemon_spare_is_never_handed_to_a_requeued_job() -> None:
    s = with_lemons(snap([view("n1", idle=False)], [view("s1", 0.5), view("s2", 2)]), "s1")
    v = [Verdict("42", "n1", "xid", "gpu_memory_error", "", {})]
    plan = plan_handoff("42", "train", True, v, s, CFG, {}, JobLedger("42"), 4)
    assert [(a.node, a.dst) for a in plan.actions if isinstance(a, Move)] == [("s2", "train")]


def test_a_replacement_spare_is_never_a_lemon(tmp_path: Path) -> None:
    s = cluster(failed=("spare1",), spares=("spare2", "spare3"))
    done = replace_failed_spares("42", "train", s.the_job, True, JobLedger("42", ["node2"],
                                                                           ["spare1"]),
                                 ReserveConfig(base_dir=str(tmp_path), min_target=0), s,
                                 Gate(), RESPARE_NOW, lambda: RESPARE_NOW,
                                 frozenset({"spare2"}))
    assert done is not None and done.replaced_by == ["spare3"]


class HandoffSlurm(FakeSlurm):
    """What EpilogSlurmctld's verdict path asks of Slurm."""

    def sacct_raw(self, fields, args=()):
        return "node[1-4]\n"

    def node_events_raw(self, args=()):
        raise SlurmRobustError("no accounting here")

    def drain(self, name, reason):
        self.calls.append(("drain", name, reason))


def test_job_end_records_blames_and_hands_over_no_lemon(tmp_path: Path) -> None:
    """spare2 is a lemon (three other jobs blamed it): the requeued job gets spare3; the
    verdict against node1 is a blame in the ledger and its drain a drain."""
    # The fake clock is in 1970: keep its rows (retention is counted from the real now).
    site = SiteConfig(verdict_log=str(tmp_path / "log" / "verdicts.jsonl"),
                      reserve={"min_target": 0},
                      ledger={"dir": str(tmp_path / "ledger"), "retain_days": 1e6,
                              "lemon_window_days": 1e6,
                              "lemons_file": str(tmp_path / "lemons.json")})
    record_safely([NodeEvent("spare2", EventKind.BLAME, "epilog_slurmctld", job_id=str(j))
                   for j in (7, 8, 9)], site)
    root = tmp_path / "log" / "verdicts"
    ensure_verdict_root(root)
    write_verdict(root, "alice", "42", "node1", "Xid 79 '); DROP TABLE events;--",
                  "gpu_memory_error", evidence={"xid": 79})
    s = HandoffSlurm([node(f"node{i}") for i in range(1, 5)]
                     + [node(n) for n in ("spare2", "spare3")],
                     {"train": [f"node{i}" for i in range(1, 5)],
                      "standby": ["spare2", "spare3"]}, cluster().the_job)
    report = handle_job_end(job_end_from_env(ENV), site, lambda: s, lambda _s: Gate(),
                            clock=lambda: RESPARE_NOW)
    assert report is not None and report.handed_over == ["spare3"]
    assert report.drained == ["node1"]
    events = NodeLedger(LedgerConfig(dir=str(tmp_path / "ledger"),
                                     retain_days=1e6)).history("node1")
    assert [(e.kind, e.job_id, e.source) for e in events] == [
        (EventKind.DRAIN, "42", "reserve handoff"), (EventKind.BLAME, "42", "epilog_slurmctld")]
    assert events[1].check == "gpu_memory_error"
    assert events[1].evidence["reason"].startswith("Xid 79 '); DROP TABLE events;--")
    assert events[1].evidence["evidence"] == {"xid": 79}


def test_job_end_applies_verdicts_when_the_ledger_is_broken(tmp_path: Path) -> None:
    site = SiteConfig(verdict_log=str(tmp_path / "log" / "verdicts.jsonl"),
                      reserve={"min_target": 0},
                      ledger={"dir": str(tmp_path / "ledger")})
    (tmp_path / "ledger").mkdir(mode=0o777)
    (tmp_path / "ledger").chmod(0o777)  # unsafe: every ledger call refuses
    root = tmp_path / "log" / "verdicts"
    ensure_verdict_root(root)
    write_verdict(root, "alice", "42", "node1", "xid", "gpu_memory_error")
    s = HandoffSlurm([node(f"node{i}") for i in range(1, 5)] + [node("spare3")],
                     {"train": [f"node{i}" for i in range(1, 5)], "standby": ["spare3"]},
                     cluster().the_job)
    report = handle_job_end(job_end_from_env(ENV), site, lambda: s, lambda _s: Gate(),
                            clock=lambda: RESPARE_NOW)
    assert report is not None and report.drained == ["node1"]
    assert report.handed_over == ["spare3"]
    assert not (tmp_path / "ledger" / "nodes.sqlite3").exists()


class DeepGate(Gate):
    def run_deep(self, name):
        return DeepRun(name, True, False, "slurm_robust: deep_gpu_burn: slow")


def test_the_executor_records_its_deep_checks_and_drains(tmp_path: Path) -> None:
    s = HandoffSlurm([node("n1")], {"train": ["n1"]}, cluster().the_job)
    got: list[list[NodeEvent]] = []
    ex = Executor(s, DeepGate(), tmp_path / "reserve.jsonl", "reconcile",
                  clock=lambda: NOW, record=got.append)
    ex.apply([DeepCheck("n1", "candidate for the reserve")])
    assert [(e.kind, e.source) for e in got[0]] == [
        (EventKind.DEEP_CHECK_FAILED, "reserve reconcile"), (EventKind.DRAIN, "reserve reconcile")]
    dry = Executor(s, DeepGate(), tmp_path / "reserve.jsonl", "reconcile", dry_run=True,
                   clock=lambda: NOW, record=got.append)
    dry.apply([DeepCheck("n1", "candidate")])
    assert len(got) == 1  # a dry run records nothing
