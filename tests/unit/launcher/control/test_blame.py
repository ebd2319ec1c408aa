"""What a run says when it blames a node, and the cap on how many it may blame."""

from __future__ import annotations

from slurm_robust.health import PENDING_PREFIX
from slurm_robust.launcher.control.blame import verdict_reason
from slurm_robust.launcher.control.ladder import Decision, capped
from slurm_robust.launcher.enums import Rung


def test_verdict_reason_names_class_and_evidence_not_the_ladder() -> None:
    r = verdict_reason("node_lost", {"heartbeat_age_s": 12.4, "connection_closed": False})
    assert r == f"{PENDING_PREFIX} node_lost: heartbeat lost 12s"
    r = verdict_reason("gpu_memory_error", {"exit_code": 1, "line": "Xid 79 on GPU 3"})
    assert r == f"{PENDING_PREFIX} gpu_memory_error: exit 1; Xid 79 on GPU 3"
    r = verdict_reason("node_lost", {"controller_lost": True, "why": "timed out"})
    assert r == f"{PENDING_PREFIX} node_lost: controller heartbeat lost"
    r = verdict_reason("gpu_unavailable", {}, "in-job monitor on node3: gpu_xid: Xid 79 on GPU 0")
    assert r == f"{PENDING_PREFIX} gpu_unavailable: gpu_xid: Xid 79 on GPU 0"
    r = verdict_reason("cuda_error", {"exit_code": 1, "diagnosis_reason":
                                      "slurm_robust: host_mem_available: actual 0 B"})
    assert r == f"{PENDING_PREFIX} cuda_error: host_mem_available: actual 0 B"


def test_cap_stops_a_run_instead_of_blaming_more() -> None:
    spare = Decision(Rung.SPARE, "node(s) n3 blamed", ("n3",))
    assert capped(spare, ["n1"], 2) is spare
    assert capped(spare, ["n1", "n3"], 2) is spare  # blamed again: no new node
    stop = capped(spare, ["n1", "n2"], 2)
    assert stop.rung == Rung.STOP and not stop.evict
    assert "max_blamed_nodes=2" in stop.reason and "n1, n2, n3" in stop.reason
    in_place = Decision(Rung.IN_PLACE, "restart")
    assert capped(in_place, ["n1", "n2", "n3"], 1) is in_place
