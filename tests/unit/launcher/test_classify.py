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


# The five tests below are each written from a development entry of the failure corpus
# (tests/data/failure_corpus, ids in classify_seen_ids.txt), its excerpt copied here.

def test_slurm_newer_oom_kill_wording_is_host_memory():
    # nextflow-5932-slurm-oom-kill-step: Slurm 21+ says "oom_kill event", older "oom-kill".
    c = classify_failure(None, None, "slurmstepd: error: Detected 1 oom_kill event in "
                                     "StepId=11300781.0.")
    assert (c.cls, c.side) == ("cpu_oom", "user"), c


def test_nccl_invalid_usage_is_the_jobs_configuration_not_the_fabric():
    # nccl-1241-multiple-ranks-one-gpu: NCCL's own verdict that the caller misused it.
    log = ("NCCL error in: /opt/pytorch/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL"
           ".cpp:1287, invalid usage, NCCL version 2.17.1 ncclInvalidUsage: This usually "
           "reflects invalid usage of NCCL library. Las")
    c = classify_failure(None, None, log)
    assert (c.cls, c.side) == ("bad_config", "user") and not c.evicts, c
    # Transport errors keep their class.
    assert classify_failure(1, None, "NCCL error in: ProcessGroupNCCL.cpp:825, unhandled "
                                     "system error, NCCL version 2.7.8").cls == "network"


def test_a_hosted_api_rate_limit_is_an_external_service_of_unknown_side():
    # ernie-1031-openai-rate-limit-429: the service's limit or the job's request rate.
    log = ("raise self._make_status_error_from_response(err.response) from None\n"
           "openai.RateLimitError: Error code: 429 - {'error': {'code': "
           "'rpm_rate_limit_exceeded', 'message': 'Rate limit reached for RPM', 'type': "
           "'rate_limit_exceeded'}, 'id': 'as-wbx23eriqh'}")
    c = classify_failure(1, None, log)
    assert (c.cls, c.side) == ("external_service", "unknown") and not c.evicts, c


def test_lmdb_stale_handle_is_where_the_job_put_its_database():
    # aster-63-lmdb-stale-handle-shared-fs: LMDB cannot live on a network file system.
    c = classify_failure(None, None, "`lmdb.Error: /xxx/xxx/recognition/CVPR2016/: "
                                     "Stale file handle`")
    assert (c.cls, c.side) == ("bad_config", "user") and not c.evicts, c
    # Any other stale handle is still a mount problem.
    other = classify_failure(1, None, "OSError: [Errno 116] Stale file handle")
    assert other.cls == "filesystem_mount", other


def test_a_run_of_loss_scale_overflows_is_a_divergence_a_few_are_routine():
    # chatglm6b-1008-deepspeed-overflow-loss-scale: the scale halves step after step.
    scales = [65536, 32768, 16384, 8192, 4096, 2048]
    log = "\n".join(
        ["[INFO] [loss_scaler.py:188:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping "
         "step. Attempted loss scale: 65536, but hysteresis is 2. Reducing hysteresis to 1"]
        + [f"[INFO] [loss_scaler.py:181:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping "
           f"step. Attempted loss scale: {s}, reducing to {s // 2}" for s in scales])
    assert classify_failure(None, None, log).cls == "nan"
    # Two overflow skips early on and then a kill: the kill is what ended the run.
    routine = "\n".join(log.splitlines()[:2] + ["Killed"])
    assert classify_failure(None, signal.SIGKILL, routine).cls == "worker_signal"
    # The fatal message itself needs no run.
    assert classify_failure(1, None, "Exception: Current loss scale already at minimum - "
                                     "cannot decrease scale anymore. Exiting run.").cls == "nan"


def test_a_bare_exception_line_counts_when_the_process_died_printing_it():
    # A library error with no traceback in the tail (the traceback went to another
    # stream): as the last line it is what the process died of.
    last = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x18 and 512x1024)"
    c = classify_failure(1, None, "epoch 0\n" + last)
    assert c.cls == "user_exception" and c.line == last and c.side == "unknown"
    # The same words quoted inside a message, with output after them, are no raise.
    quoted = "warning: retrying after RuntimeError: shapes differ\nstep 12 loss 0.4\nstep 13"
    assert classify_failure(1, None, quoted).cls == "worker_signal"


def test_a_collapsed_loss_scale_is_a_divergence_one_halving_is_not():
    line = "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {}"
    assert classify_failure(1, None, line.format("1.020640762992391e-202")).cls == "nan"
    assert classify_failure(1, None, line.format("32768.0")).cls != "nan"
