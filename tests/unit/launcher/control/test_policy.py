"""The launcher's pure decisions: hang threshold, step anomalies, the ladder, slots."""

from __future__ import annotations

import math

import pytest

from slurm_robust.launcher.classify import classify_failure
from slurm_robust.launcher.control.generation import Failure
from slurm_robust.launcher.control.ladder import Facts, decide
from slurm_robust.launcher.control.policy import (
    assign_slots,
    blamed_nodes,
    hang_timeout,
    is_hung,
    step_anomaly,
    unexplained_repeats,
)
from slurm_robust.launcher.control.stop_diagnosis import wants_diagnosis
from slurm_robust.launcher.enums import Category
from slurm_robust.launcher.messages import WorkerExit
from slurm_robust.taxonomy import Action, Side


def ladder(blamed: tuple[str, ...] = (), **kw) -> Facts:
    """Facts whose ``blamed`` nodes are named by evidence (blamed whatever the class)."""
    base = dict(cls="worker_signal", controller_node="node1", spares_left=1,
                restarts=0, max_restarts=10, signature=None, signature_seen=0, no_progress=0,
                max_no_progress=3, named=blamed, blame_named=bool(blamed))
    base.update(kw)
    return Facts(**base)


def test_hang_timeout_is_floor_or_multiple_of_median():
    assert hang_timeout([], 20.0, 10.0) == 20.0
    assert hang_timeout([0.1] * 10, 20.0, 10.0) == 20.0
    assert hang_timeout([3.0, 3.0, 100.0], 20.0, 10.0) == 30.0


def test_is_hung_uses_startup_timeout_before_first_step():  # reports_steps defaults True
    assert not is_hung(0.0, 100.0, [], 20.0, 10.0, started=False, startup_timeout_s=180.0)
    assert is_hung(0.0, 181.0, [], 20.0, 10.0, started=False, startup_timeout_s=180.0)
    assert is_hung(0.0, 21.0, [0.5], 20.0, 10.0, started=True, startup_timeout_s=180.0)
    assert not is_hung(0.0, 19.0, [0.5], 20.0, 10.0, started=True, startup_timeout_s=180.0)


def test_step_anomaly_nan_inf_and_spike():
    history = [2.0] * 10
    assert step_anomaly(history, math.nan, 5.0) == "nan"
    assert step_anomaly(history, math.inf, 5.0) == "nan"
    assert step_anomaly(history, 10.1, 5.0) == "loss_spike"
    assert step_anomaly(history, 9.9, 5.0) is None
    assert step_anomaly(history, None, 5.0) is None


def test_no_spike_before_enough_history():
    assert step_anomaly([1.0, 1.0], 100.0, 5.0) is None


def test_transient_fault_restarts_in_place():
    d = decide(ladder())
    assert d.rung == "in_place" and d.evict == ()


def test_blamed_node_uses_spare_and_is_evicted():
    d = decide(ladder(cls="node_lost", blamed=("node3",)))
    assert d.rung == "spare" and d.evict == ("node3",)


def test_no_spare_left_requeues():
    d = decide(ladder(cls="node_lost", blamed=("node3",), spares_left=0))
    assert d.rung == "requeue" and d.evict == ("node3",)


def test_controller_node_blamed_requeues_even_with_spares():
    d = decide(ladder(cls="node_lost", blamed=("node1",), spares_left=2))
    assert d.rung == "requeue"


def test_same_user_error_after_restart_stops_with_verdict():
    first = decide(ladder(cls="user_exception", signature="TypeError@t.py:3", signature_seen=0))
    again = decide(ladder(cls="user_exception", signature="TypeError@t.py:3", signature_seen=1))
    assert first.rung == "in_place"
    assert again.rung == "stop" and "TypeError@t.py:3" in again.reason


def test_no_progress_and_budget_stop():
    assert decide(ladder(no_progress=3)).rung == "stop"
    assert decide(ladder(restarts=10)).rung == "stop"
    assert "budget" in decide(ladder(restarts=10)).reason


def test_blamed_nodes_by_class_or_repeat_count():
    assert blamed_nodes("gpu_memory_error", ["n1"], {}, 3) == ("n1",)
    # A CUDA error may be the user's: it goes to diagnosis, it does not evict by itself.
    assert blamed_nodes("cuda_error", ["n1"], {}, 3) == ()
    assert blamed_nodes("network", ["n1"], {"n1": 2}, 3) == ()
    assert blamed_nodes("network", ["n1"], {"n1": 3}, 3) == ("n1",)
    # Repeats of a class that is no evidence against the node blame nobody by count:
    # unknown (the catch-all), user side, off-node (shared storage, a web service), or a
    # node-side class the classifier itself called unknown for this failure.
    for cls in ("worker_signal", "user_exception", "bad_config", "remote_storage",
                "external_service", "cuda_error", "job_hang"):
        assert blamed_nodes(cls, ["n1"], {"n1": 9}, 3) == (), cls
    assert blamed_nodes("disk_full", ["n1"], {"n1": 3}, 3) == ("n1",)
    assert blamed_nodes("disk_full", ["n1"], {"n1": 3}, 3, side="unknown") == ()
    # A spike is tested after the all-reduce: the rank that reports it says nothing.
    assert blamed_nodes("loss_spike", ["n1"], {"n1": 9}, 3) == ()


def test_an_evicting_class_the_classifier_called_unknown_goes_to_diagnosis_not_eviction():
    # "unable to communicate with the NVIDIA driver" names no hardware fault: a job whose
    # cgroup holds no GPU prints it too. Only the node's checks may blame the node.
    assert blamed_nodes("gpu_unavailable", ["n1"], {}, 3, side="unknown") == ()
    assert unexplained_repeats("gpu_unavailable", ["n1"], {"n1": 3}, 3, side="unknown") \
        == ("n1",)
    # The hardware's own report (infrastructure side), or a detector's incident (no
    # classifier side: a lost node, the fail-slow vote), blames at once as before.
    assert blamed_nodes("gpu_unavailable", ["n1"], {}, 3, side="infrastructure") == ("n1",)
    assert blamed_nodes("node_lost", ["n1"], {}, 3) == ("n1",)
    assert blamed_nodes("mfu_decline", ["n1"], {}, 3) == ("n1",)
    assert unexplained_repeats("gpu_unavailable", ["n1"], {"n1": 3}, 3) == ()
    c = classify_failure(1, None, "NVIDIA-SMI has failed because it couldn't communicate "
                         "with the NVIDIA driver. Make sure that the latest NVIDIA driver "
                         "is installed and running.")
    assert (c.cls, c.side, c.action) == ("gpu_unavailable", "unknown", "diagnose")
    failure = Failure(WorkerExit(rank=0, gen=1, exit_code=1, signal=None, time=0.0,
                                 cls=c.cls, category=Category(c.category),
                                 signature=c.signature, side=Side(c.side),
                                 action=Action(c.action)), "n1", 1, 0.0)
    assert wants_diagnosis(failure, {}, 3, passed=(), agent_can_answer=True)


def test_a_repeat_of_an_unknown_side_user_class_goes_the_unknown_way_not_user_code():
    # A user-side error that comes back after a clean restart stops as user code...
    d = decide(ladder(cls="user_exception", side="user", signature="KeyError@x.py:3",
                      signature_seen=1))
    assert d.rung == "stop" and "same user-code error" in d.reason
    # ...one whose side the classifier could not tell restarts, and once its node passed
    # stop-time diagnosis at the repeat threshold the run stops naming an unknown cause.
    unknown = dict(cls="bad_config", side="unknown", signature="bad_config:learned:1",
                   signature_seen=1, named=("n1",))
    assert decide(ladder(**unknown, failures={"n1": 2})).rung == "in_place"
    d = decide(ladder(**unknown, failures={"n1": 3}, diagnosis_passed=True))
    assert d.rung == "stop" and "unknown cause" in d.reason and "user code" not in d.reason


def test_assign_slots_keeps_surviving_nodes_in_place():
    slots, spares = assign_slots(["a", "b", "c"], ["b", "c", "d", "e"], 3)
    assert slots == ["d", "b", "c"] and spares == ["e"]


def test_assign_slots_fresh_and_too_few():
    assert assign_slots([], ["a", "b", "c"], 2) == (["a", "b"], ["c"])
    with pytest.raises(ValueError, match="2 node"):
        assign_slots([], ["a", "b"], 3)


def test_rendezvous_ports_differ_between_jobs_and_attempts():
    from slurm_robust.launcher.ports import PORT_SPAN, rendezvous_port

    ports = {rendezvous_port(29500, job, a) for job in ("101", "102") for a in range(3)}
    assert len(ports) == 6
    assert all(29500 <= p < 29500 + PORT_SPAN for p in ports)
    assert rendezvous_port(29500, "101", 1) == rendezvous_port(29500, "101", 1)


def test_rendezvous_ports_stay_below_the_ephemeral_range():
    """Outgoing connections hold ports from 32768 on (Linux's default range); a listener
    cannot bind one of them, so no job's rendezvous port may lie there."""
    from slurm_robust.launcher.ports import EPHEMERAL_FIRST, rendezvous_port

    ports = {rendezvous_port(29500, str(job), a) for job in range(2000) for a in range(40)}
    assert max(ports) < EPHEMERAL_FIRST and min(ports) >= 29500
    assert len({rendezvous_port(29500, str(job), 0) for job in range(2000)}) == 102
    assert rendezvous_port(61000, "7", 3) >= 61000  # a base above the range is kept


def test_a_base_without_room_is_refused_and_an_overlap_is_named(tmp_path):
    from slurm_robust.errors import UsageError
    from slurm_robust.launcher.config import RunConfig
    from slurm_robust.launcher.control.controller import ephemeral_overlap

    with pytest.raises(UsageError, match="master_port 65530"):
        RunConfig(command=("true",), run_dir=str(tmp_path / "run"), master_port=65530)
    rng = tmp_path / "range"
    rng.write_text("32768\t60999\n")
    assert ephemeral_overlap(29500, str(rng)) is None
    rng.write_text("10000 65535\n")  # a site that widened it
    assert "29500-32763 overlap this node's ephemeral port range 10000-65535" in \
        ephemeral_overlap(29500, str(rng))
