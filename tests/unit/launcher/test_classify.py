"""Classification of failed workers from exit status and log tails."""

from __future__ import annotations

import signal

from slurm_robust.launcher.classify import EXIT_NONFINITE, classify_failure


def tb(exc: str, prefix: str = "") -> str:
    return "\n".join(prefix + line for line in [
        "Traceback (most recent call last):",
        '  File "/w/train.py", line 42, in main',
        "    x = batch[idx]",
        exc])


def test_user_exceptions_are_user_code_with_a_stable_signature():
    for exc in ("TypeError: unsupported operand", "IndexError: list index out of range",
                "KeyError: 'lr'"):
        c = classify_failure(1, None, "step 3\n" + tb(exc))
        assert c.cls == "user_exception" and c.category == "explicit"
        assert c.signature == f"{exc.split(':')[0]}@train.py:42"


def test_torch_rank_prefix_is_understood():
    c = classify_failure(1, None, tb("TypeError: bad", prefix="[rank3]: "))
    assert c.cls == "user_exception" and c.signature == "TypeError@train.py:42"


def test_hardware_lines_win_over_the_traceback():
    log = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus\n" + \
        tb("RuntimeError: CUDA error: unspecified launch failure")
    assert classify_failure(1, None, log).cls == "gpu_unavailable"
    assert classify_failure(1, None, tb("RuntimeError: CUDA error: an illegal memory "
                                        "access was encountered")).cls == "cuda_error"
    assert classify_failure(1, None, tb("torch.OutOfMemoryError: CUDA out of memory. "
                                        "Tried to allocate 2 GiB")).cls == "gpu_oom"
    assert classify_failure(1, None, "NCCL WARN NET/IB : Got completion from peer 10.0.0.2 "
                                     "with status=12 opcode=1").cls == "network"
    assert classify_failure(1, None, "uncorrectable ECC error encountered").cls == \
        "gpu_memory_error"


def test_peer_disconnect_is_secondary_network_error():
    c = classify_failure(1, None, tb("RuntimeError: [../gloo/transport/tcp/pair.cc:534] "
                                     "Connection closed by peer [127.0.0.1]:4242"))
    assert c.cls == "network" and c.secondary


def test_signal_kill_is_worker_signal_and_nonfinite_exit_is_nan():
    c = classify_failure(None, signal.SIGKILL, "step 10\n")
    assert c.cls == "worker_signal" and c.evidence["signal_name"] == "SIGKILL"
    assert classify_failure(EXIT_NONFINITE, None, "").cls == "nan"
    assert classify_failure(None, signal.SIGKILL, "Out of memory: Killed process 12").cls == \
        "cpu_oom"


PROGRESS = "\n".join(f"step {s}, loss = 2.1 (70.0 examples/sec; {t} sec/batch)"
                     for s, t in ((10, 3.6), (20, 10.1), (30, 9.9)))


def test_no_exit_with_step_rate_lines_is_a_slowdown_never_blamed_from_the_log():
    c = classify_failure(None, None, PROGRESS)
    assert (c.cls, c.side, c.action) == ("mfu_decline", "unknown", "diagnose")
    assert c.evidence["progress_lines"] == 3


def test_step_rate_lines_before_a_real_exit_do_not_make_a_slowdown():
    assert classify_failure(None, signal.SIGKILL, PROGRESS).cls == "worker_signal"
    assert classify_failure(1, None, PROGRESS + "\n" + tb("KeyError: 'lr'")).cls \
        == "user_exception"
    assert classify_failure(None, None, "step 10 started").cls == "worker_signal"
