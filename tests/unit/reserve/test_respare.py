"""A handed-over spare that fails its prolog is replaced from the reserve (bounded), and a
job that cannot be placed any more is stopped with a verdict, never left pending."""

from __future__ import annotations

import os
from pathlib import Path

from slurm_robust.records import read_records
from slurm_robust.reserve.config import ReserveConfig
from slurm_robust.reserve.handoff import handle_job_end, job_end_from_env
from slurm_robust.reserve.ledger import JobLedger, load_ledger, save_ledger
from slurm_robust.reserve.respare import failed_check, replace_failed_spares, stop_when_requeued
from slurm_robust.site_config import SiteConfig
from slurm_robust.slurm import Job, Node

NOW = 1_000_000.0


def node(name: str, drained: bool = False, reason: str = "", state: str = "idle") -> Node:
    return Node(name, state, frozenset({"DRAIN"} if drained else ()), reason, "", 0,
                ("train",), 2, 0)


def job(state: str = "PENDING", nodes: int = 4) -> Job:
    return Job("42", "j", "alice", state, "", "train", (), nodes, "", 1, True, 0, 0, 0, 0,
               "", "")


class FakeSlurm:
    def __init__(self, nodes: list[Node], parts: dict[str, list[str]], the_job: Job) -> None:
        self.node_map = {n.name: n for n in nodes}
        self.parts = parts
        self.the_job = the_job
        self.calls: list[tuple] = []

    def nodes(self, names=None):
        names = list(self.node_map) if names is None else list(names)
        return [self.node_map[n] for n in names if n in self.node_map]

    def job(self, job_id):
        return self.the_job

    def partition_nodes(self, name):
        return list(self.parts.get(name, []))

    def set_partition_nodes(self, name, nodes):
        self.calls.append(("set", name, list(nodes)))
        self.parts[name] = list(nodes)

    def update_job(self, job_id, **fields):
        self.calls.append(("update", job_id, fields))

    def cancel(self, job_id, signal=None):
        self.calls.append(("cancel", job_id))


class Gate:
    def last_deep_pass(self, name):
        return NOW - 60.0


def cfg_for(tmp_path: Path, **kw) -> ReserveConfig:
    return ReserveConfig(base_dir=str(tmp_path), min_target=0, **kw)


def cluster(failed: tuple[str, ...] = ("spare1",), spares: tuple[str, ...] = ("spare2",),
            nodes: int = 4) -> FakeSlurm:
    bad = "slurm_robust: gpu_xid: Xid 79 on GPU 0"
    all_nodes = [node("node1"), node("node2", True, "slurm_robust: pending deep check: x"),
                 node("node3"), node("node4")]
    all_nodes += [node(n, n in failed, bad if n in failed else "") for n in
                  ("spare1", "spare2", "spare3")]
    return FakeSlurm(all_nodes, {"train": ["node1", "node2", "node3", "node4", "spare1"],
                                 "standby": list(spares)}, job(nodes=nodes))


def test_only_check_failures_count_as_a_failed_spare() -> None:
    assert failed_check(node("a", True, "slurm_robust: gpu_xid: Xid 79"))
    assert failed_check(node("a", True, "Prolog error"))
    assert failed_check(node("a", True, "slurm_robust: repeat offender: gpu_xid: Xid 79; "
                                        "again 1.0 h after return"))
    assert not failed_check(node("a", True, "slurm_robust: pending deep check: node_lost: x"))
    assert not failed_check(node("a", True, "maintenance by alice"))
    assert not failed_check(node("a", False, ""))


def test_a_spare_failing_its_prolog_is_replaced_and_recorded(tmp_path: Path) -> None:
    s = cluster()
    ledger = JobLedger("42", ["node2"], ["spare1"])
    done = replace_failed_spares("42", "train", s.the_job, True, ledger, cfg_for(tmp_path), s,
                                 Gate(), NOW, lambda: NOW)
    assert done is not None and done.failed == ["spare1"] and done.replaced_by == ["spare2"]
    assert "spare2" in s.parts["train"] and s.parts["standby"] == []
    assert ledger.spare_failed == ["spare1"] and ledger.replacements == ["spare2"]
    assert done.stop_reason is None
    # the same failure is not counted twice at the next job end
    again = replace_failed_spares("42", "train", s.the_job, True, ledger, cfg_for(tmp_path),
                                  s, Gate(), NOW, lambda: NOW)
    assert again is None


def test_retries_are_bounded_then_the_job_stops_with_a_verdict(tmp_path: Path) -> None:
    s = cluster(failed=("spare1", "spare2"), spares=("spare3",))
    ledger = JobLedger("42", ["node2"], ["spare1"], [], ["spare2"])  # one retry spent
    ledger.spare_failed = ["spare1"]  # and counted
    done = replace_failed_spares("42", "train", s.the_job, True, ledger,
                                 cfg_for(tmp_path, spare_retries=1), s, Gate(), NOW,
                                 lambda: NOW)
    assert done is not None and done.failed == ["spare2"] and done.replaced_by == []
    assert done.shortfall == 1 and "spare3" in s.parts["standby"]
    assert done.stop_reason and "retries spent" in done.stop_reason
    assert "needs 4" in done.stop_reason


def test_a_job_that_fits_on_what_is_left_is_not_stopped(tmp_path: Path) -> None:
    s = cluster(failed=("spare1",), spares=(), nodes=3)
    done = replace_failed_spares("42", "train", s.the_job, True, JobLedger("42", ["node2"],
                                                                           ["spare1"]),
                                 cfg_for(tmp_path), s, Gate(), NOW, lambda: NOW)
    assert done is not None and done.shortfall == 1 and done.stop_reason is None


def test_stop_waits_for_the_requeue_then_cancels_with_the_verdict() -> None:
    s = cluster()
    s.the_job = job("COMPLETING")
    t = [0.0]

    def sleep(dt: float) -> None:
        t[0] += dt
        s.the_job = job("PENDING")

    what = stop_when_requeued(s, "42", "slurm_robust: stopped: x", 10.0, lambda: t[0], sleep)
    assert what == "stopped with a verdict"
    assert s.calls == [("update", "42", {"Comment": "slurm_robust: stopped: x"}),
                       ("cancel", "42")]


def test_job_end_without_verdicts_checks_spares_only_with_a_ledger(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_USER": "alice",
           "SLURM_JOB_UID": str(os.geteuid()), "SLURM_JOB_NODELIST": "node[1-4]",
           "SLURM_JOB_PARTITION": "train", "SLURM_JOB_RESTART_COUNT": "2"}
    site = SiteConfig(verdict_log=str(tmp_path / "verdicts.jsonl"),
                      reserve={"min_target": 0})

    def no_slurm():
        raise AssertionError("no ledger: no Slurm call")

    assert handle_job_end(job_end_from_env(env), site, no_slurm, no_slurm) is None
    cfg = ReserveConfig(base_dir=str(tmp_path))
    save_ledger(cfg.ledger_dir, JobLedger("42", ["node2"], ["spare1"]))
    s = cluster()
    report = handle_job_end(job_end_from_env(env), site, lambda: s, lambda _s: Gate(),
                            clock=lambda: NOW)
    assert report is not None and report.spare_failed == ["spare1"]
    assert report.handed_over == ["spare2"] and report.requeued
    logged = read_records(site.verdict_log).records
    assert [(r["action"], r["node"], r["handed_over"]) for r in logged] == \
        [("spare_failed", "spare1", ["spare2"])]
    assert load_ledger(cfg.ledger_dir, "42").replacements == ["spare2"]
