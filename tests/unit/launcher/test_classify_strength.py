"""Evidence strength decides between matching rules, kernel formats are read only where
the kernel wrote them, and the answer says why (rule, line, strength)."""

from __future__ import annotations

import pytest

from slurm_robust.launcher.classify import (
    LOG_RULES,
    Evidence,
    Strength,
    classify,
    classify_failure,
    log_matches,
    strongest_match,
)
from slurm_robust.launcher.control.run_facts import failure_incident
from slurm_robust.taxonomy import ROWS, FailureClass

TB = 'Traceback (most recent call last):\n  File "/w/train.py", line 9, in main\n'


def test_every_rule_has_a_strength_and_hardware_reports_are_strongest():
    by_name = {r.name: r.strength for r in LOG_RULES}
    assert all(isinstance(s, Strength) for s in by_name.values())
    assert by_name["ecc"] is by_name["gpu_gone"] is Strength.HARDWARE
    assert by_name["kernel_panic"] is by_name["block_io"] is Strength.KERNEL
    assert by_name["cuda"] is by_name["gpu_oom"] is Strength.LIBRARY
    assert by_name["peer_gone"] is by_name["signal"] is Strength.GENERIC
    assert Strength.HARDWARE > Strength.KERNEL > Strength.LIBRARY > Strength.GENERIC


def test_a_stronger_later_rule_beats_a_weaker_earlier_one():
    # "Connection timed out" (generic wording, rule socket) comes before the NaN rule in
    # the list; the NaN library error is the stronger evidence and names the cause.
    log = ("c10d: Connection timed out while waiting for rank 3\n"
           "FloatingPointError: Loss became infinite or NaN at step 812")
    c = classify_failure(1, None, log)
    assert c.cls == "nan", c
    assert c.evidence["classifier"]["rule"] == "nan"
    assert c.evidence["classifier"]["outranked"] == ["socket"]
    # A broken connection next to a CUDA error: the CUDA error is the primary failure.
    log = ("Connection reset by peer\n"
           "RuntimeError: CUDA error: an illegal memory access was encountered")
    c = classify_failure(1, None, log)
    assert (c.cls, c.secondary) == ("cuda_error", False)


def test_ties_keep_the_rule_order():
    log = ("RuntimeError: CUDA error: out of memory\n"
           "RuntimeError: CUDA error: an illegal memory access was encountered")
    rule, _ = strongest_match(log)
    assert rule.name == "gpu_oom"  # both library errors: the earlier rule wins
    names = [r.name for r, _ in log_matches(log)]
    assert names.index("gpu_oom") < names.index("cuda")


@pytest.mark.parametrize("log", [
    # A Python error whose text mentions a kernel panic and a call trace.
    TB + "RuntimeError: Call Trace: kernel panic in my_fused_kernel+0x1f/0x40",
    # A user's log line quoting the kernel's words, no kernel prefix.
    "worker 3: Kernel panic - not syncing: my own test message\n"
    "ValueError: bad batch",
    # A Python traceback whose frames look like kernel symbols.
    TB + "  my_kernel+0x1f/0x40\nValueError: Call Trace: nothing to see",
])
def test_text_that_only_mentions_the_kernel_is_not_a_panic(log):
    c = classify_failure(1, None, log)
    assert c.cls != "kernel_panic" and not c.evicts, c
    assert c.evidence["classifier"]["rule"] not in ("kernel_panic", "kernel_trace")


def test_kernel_formatted_panic_and_trace_still_evict():
    panic = "[ 1351.97] Kernel panic - not syncing: Fatal exception in interrupt"
    c = classify_failure(None, None, panic)
    assert (c.cls, c.action, c.strength) == ("kernel_panic", "evict", "kernel")
    trace = ("[ 1351.970249] Call Trace:\n[ 1351.970343]  <TASK>\n"
             "[ 1351.970434]  dxgsyncobject_destroy+0x10f/0x180")
    c = classify_failure(None, None, trace)
    assert (c.cls, c.action, c.evidence["classifier"]["rule"]) == \
        ("kernel_panic", "evict", "kernel_trace")


def test_a_hung_task_report_is_diagnosed_not_an_eviction():
    hung = ("[  240.118201] INFO: task python:1234 blocked for more than 120 seconds.\n"
            "[  240.118310] \"echo 0 > /proc/sys/kernel/hung_task_timeout_secs\" disables "
            "this message.\n"
            "[  240.118400] Call Trace:\n"
            "[  240.118420]  __schedule+0x2e3/0x740\n"
            "[  240.118431]  io_schedule+0x16/0x40")
    c = classify_failure(None, None, hung)
    assert not c.evicts and c.cls != "kernel_panic", c
    assert (c.cls, c.side, c.action) == ("job_hang", "unknown", "diagnose")
    assert c.evidence["classifier"]["rule"] == "hung_task"
    # The kernel itself panicking on a hung task (hung_task_panic=1) is a panic.
    c = classify_failure(None, None, "<0>[2315424.098863] Kernel panic - not syncing: "
                                     "hung_task: blocked tasks\n" + hung)
    assert c.cls == "kernel_panic" and c.evicts


def test_a_soft_lockup_counts_only_in_the_kernel_wording():
    c = classify_failure(None, None, "watchdog: BUG: soft lockup - CPU#98 stuck for 22s!")
    assert (c.cls, c.strength) == ("cpu_overload", "kernel")
    c = classify_failure(1, None, TB + "ValueError: soft lockup detector says hi")
    assert c.cls == "user_exception"


def test_the_answer_carries_rule_line_and_strength():
    c = classify(Evidence(exit_code=1, log_tail=TB + "RuntimeError: CUDA error: an "
                          "illegal memory access was encountered"))
    why = c.evidence["classifier"]
    assert why == {"rule": "cuda", "strength": "library", "source": "log",
                   "side": "unknown",
                   "line": "RuntimeError: CUDA error: an illegal memory access was "
                           "encountered"}
    assert (c.rule, c.strength) == ("cuda", "library")
    c = classify(Evidence(exit_code=1, nvml={"ecc_uncorrectable": [2]}))
    assert c.evidence["classifier"]["strength"] == "hardware"
    assert c.evidence["classifier"]["rule"] == "nvml"
    c = classify(Evidence(exit_code=1, log_tail=TB + "ValueError: bad shape"))
    assert c.evidence["classifier"]["rule"] == "exception"
    assert c.evidence["classifier"]["side"] == "user"
    c = classify(Evidence(signal=9))
    assert c.evidence["classifier"]["rule"] == "exit_status"
    assert c.evidence["classifier"]["strength"] == "generic"


def test_the_classifier_evidence_reaches_the_incident_record():
    # The agent's WorkerExit evidence is the classification's; the incident built from it
    # (what events.jsonl's `incident` holds) keeps evidence.classifier.
    from slurm_robust.launcher.control.generation import Failure, Generation
    from slurm_robust.launcher.control.state import RunState
    from slurm_robust.launcher.messages import WorkerExit

    c = classify(Evidence(exit_code=1, log_tail="[ 99.1] Kernel panic - not syncing: x"))
    ex = WorkerExit(rank=1, gen=1, exit_code=1, signal=None, time=5.0, cls=c.cls,
                    category=ROWS[FailureClass(c.cls)].category, signature=c.signature,
                    line=c.line, evidence=dict(c.evidence))
    gen = Generation(number=1, attempt=0, slots=[0, 1], started_at=0.0)
    root = Failure(exit=ex, agent=1, node="n2", seen=5.0)
    gen.failures.append(root)
    inc = failure_incident("i1", gen, root, 6.0, RunState()).to_json()
    assert inc["evidence"]["classifier"]["rule"] == "kernel_panic"
    assert inc["evidence"]["classifier"]["strength"] == "kernel"
    assert inc["evidence"]["classifier"]["line"].startswith("[ 99.1] Kernel panic")


def test_user_space_that_cannot_reach_the_driver_is_diagnosed_not_evicted():
    """nvidia-smi's "couldn't communicate with the NVIDIA driver" is also what a job that
    asked Slurm for no GPU sees (its cgroup holds none): the node's own checks decide.
    The kernel's or NVML's word for a lost GPU still evicts."""
    smi = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
           "Make sure that the latest NVIDIA driver is installed and running.")
    c = classify_failure(1, None, smi)
    assert (c.cls, c.side, c.action) == ("gpu_unavailable", "unknown", "diagnose"), c
    assert not c.evicts
    lost = classify_failure(1, None, "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.")
    assert lost.cls == "gpu_unavailable" and lost.evicts
