"""The classifier's use of every kind of evidence (NVML, kernel log, task exit, log)."""

from __future__ import annotations

import dataclasses
import signal

from slurm_robust.health.probes import Probes
from slurm_robust.launcher.classify import Evidence, classify, classify_failure, nvml_evidence

TB = 'Traceback (most recent call last):\n  File "/w/train.py", line 9, in main\n'


def test_nvml_ecc_and_hardware_xid_evict_with_evidence():
    c = classify(Evidence(exit_code=1, log_tail=TB + "RuntimeError: CUDA error: unspecified "
                          "launch failure", nvml={"ecc_uncorrectable": [0, 3]}))
    assert (c.cls, c.side, c.action, c.source) == ("gpu_memory_error", "infrastructure",
                                                   "evict", "nvml")
    c = classify(Evidence(exit_code=1, nvml={"xid_events": [{"gpu": 2, "xid": 79}]}))
    assert (c.cls, c.action) == ("gpu_unavailable", "evict") and c.evidence["xids"] == [79]
    c = classify(Evidence(exit_code=1, nvml={"gpu_count": 7}, expected_gpus=8))
    assert c.cls == "gpu_unavailable"


def test_nvml_evidence_reads_injected_probes():
    ev = nvml_evidence(Probes({"xid_events": [{"gpu": 0, "xid": 48}]}).view())
    assert ev["xid_events"] == [{"gpu": 0, "xid": 48}]
    assert classify(Evidence(exit_code=1, nvml=ev)).cls == "gpu_memory_error"


def test_kernel_log_xid_old_and_new_wordings_and_application_xids():
    new = "NVRM: Xid (PCI:0000:3b:00): 79, pid=123, name=python, GPU has fallen off the bus."
    old = "NVRM: Xid (0000:3b:00): 94, Contained ECC error"
    assert classify(Evidence(exit_code=1, kernel_log=[new])).cls == "gpu_unavailable"
    assert classify(Evidence(exit_code=1, kernel_log=[old])).cls == "gpu_memory_error"
    # no Xid number at all on some drivers
    assert classify(Evidence(exit_code=1, log_tail="NVRM: GPU 0000:3b:00.0: GPU has fallen "
                             "off the bus.")).cls == "gpu_unavailable"
    app = classify(Evidence(exit_code=1, log_tail="NVRM: Xid (PCI:0000:3b:00): 13, Graphics "
                            "Exception"))
    assert (app.cls, app.side) == ("user_cuda_fault", "unknown") and not app.evicts


def test_kernel_oom_killer_needs_the_sigkill():
    line = "Out of memory: Killed process 4242 (python) total-vm:1kB"
    assert classify(Evidence(signal=signal.SIGKILL, kernel_log=[line])).cls == "cpu_oom"
    c = classify(Evidence(exit_code=1, log_tail=TB + "TypeError: x", kernel_log=[line]))
    assert c.cls == "user_exception" and c.evidence["kernel_oom"] == line


def test_trusted_task_exit_wins_over_what_the_job_saw():
    rec = {"node": "n1", "job_id": "7", "step_id": "0", "task_id": 3, "wait_status": 9,
           "exit_code": None, "signal": 9}
    c = classify(Evidence(exit_code=1, task_exit=rec))
    assert c.evidence["signal_name"] == "SIGKILL" and c.cls == "worker_signal"
    assert c.evidence["task_exit"]["node"] == "n1"


def test_wording_families():
    cases = {
        "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate": "gpu_oom",
        "RuntimeError: cuda runtime error (2) : out of memory at THCCachingAllocator.cpp":
            "gpu_oom",
        "RuntimeError: cuda runtime error (59) : device-side assert triggered at x.cu:1":
            "user_cuda_fault",
        "ib_mlx5_log.c:132 Transport retry count exceeded on mlx5_0:1/IB": "network",
        "NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory": "bad_config",
        "OSError: [Errno 30] Read-only file system: '/data'": "bad_config",
        "OSError: [Errno 28] No space left on device": "disk_full",
        "RuntimeError: DataLoader worker (pid 12) is killed by signal: Killed.": "cpu_oom",
        "FloatingPointError: Loss became infinite or NaN at iteration=5": "nan",
        "[stderr] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)":
            "job_hang",
        "Kernel panic - not syncing: Fatal exception": "kernel_panic",
        "blk_update_request: I/O error, dev nvme0n1, sector 42": "disk_fault",
    }
    for line, cls in cases.items():
        assert classify_failure(1, None, line).cls == cls, line


def test_ambiguous_cuda_error_goes_to_diagnosis_not_eviction():
    c = classify_failure(1, None, TB + "RuntimeError: CUDA error: an illegal memory access "
                         "was encountered")
    assert (c.cls, c.side, c.action) == ("cuda_error", "unknown", "diagnose")


def test_shell_exit_128_plus_n_is_the_signal():
    c = classify_failure(137, None, "Killed")
    assert c.evidence["signal_name"] == "SIGKILL" and c.cls == "worker_signal"


def test_a_recorded_change_makes_a_user_error_a_code_data_change():
    tail = ("Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n"
            "KeyError: 'angle_means'\n")
    assert classify(Evidence(exit_code=1, log_tail=tail)).cls == "user_exception"
    c = classify(Evidence(exit_code=1, log_tail=tail, change_recorded=True))
    assert c.cls == "code_data_change" and c.category == "manual" and c.side == "user"
    assert c.evidence["error_class"] == "user_exception"
    # Infrastructure evidence is not re-labelled by a change.
    hw = Evidence(exit_code=1, log_tail="uncorrectable ECC error", change_recorded=True)
    assert classify(hw).cls == "gpu_memory_error"


def test_a_recorded_change_explains_an_exit_with_no_named_cause():
    # A self-exit with no error line the patterns know, and an exception they do not
    # know: after a recorded change, the change's (ByteRobust rolls the change back).
    for tail in ("Since version 12.4 the example gives an error: KeyError: 'emb_dropout'",
                 "**RuntimeError: mat1 and mat2 shapes cannot be multiplied (185x18 and "
                 "19x56)**",
                 TB + "RuntimeError: mat1 and mat2 shapes cannot be multiplied"):
        # What the rules make of it (the change record is read before the learned
        # fallback, which only ever sees what the change does not explain).
        bare = classify(Evidence(exit_code=1, log_tail=tail), learned=False)
        assert bare.side == "unknown" and bare.cls in ("worker_signal", "user_exception")
        c = classify(Evidence(exit_code=1, log_tail=tail, change_recorded=True))
        assert (c.cls, c.side, c.action) == ("code_data_change", "user", "stop_on_repeat")
        assert c.evidence["error_class"] == bare.cls
    # A signal, a named cause of unknown side, a secondary failure or an exit status
    # nobody saw is not the change's: those keep their class and their diagnosis.
    kept = [Evidence(signal=9, log_tail="Killed"),
            Evidence(exit_code=137, log_tail=""),
            Evidence(exit_code=1, log_tail=TB + "RuntimeError: CUDA error: an illegal "
                     "memory access was encountered"),
            Evidence(exit_code=1, log_tail="RuntimeError: Connection closed by peer"),
            Evidence(exit_code=1, log_tail="OSError: [Errno 28] No space left on device"),
            Evidence(log_tail="something went wrong")]
    for ev in kept:
        bare = classify(ev)
        c = classify(dataclasses.replace(ev, change_recorded=True))
        assert (c.cls, c.side, c.action) == (bare.cls, bare.side, bare.action), ev


def test_general_signatures_added_for_issue_13():
    def cls(text: str) -> tuple[str, str]:
        c = classify(Evidence(exit_code=1, log_tail=text))
        return c.cls, c.side
    assert cls("enroot: URL https://r/v2/x/manifests/y returned error code: 401 "
               "Unauthorized") == ("bad_config", "user")
    assert cls("UserWarning: [Errno 28] No space left on device.  joblib will operate in "
               "serial mode")[0] == "container_runtime"
    assert cls("slurmstepd: error: execve(): /var/spool/slurmd/job7/slurm_script: No such "
               "file or directory")[0] == "filesystem_mount"
    assert cls("Error type: SIZE_OR_SYNTAX_MISMATCH, Expected input sizes") == \
        ("job_hang", "user")
    assert cls("NVRM: Xid (PCI:0000:dc:00): 45, pid=1, Ch 00000001 caused by previous "
               "Xid 149") == ("cuda_error", "infrastructure")
    assert cls("NVRM: Xid (PCI:0000:dc:00): 45, pid=1, Ch 00000001") == \
        ("user_cuda_fault", "unknown")
    # PyTorch's generic hint under every CUDA error is not a device-side assert.
    assert cls("RuntimeError: CUDA error: an illegal memory access was encountered\n"
               "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n") == \
        ("cuda_error", "unknown")


def test_a_bare_squashfs_name_is_pyxis_misconfiguration_a_path_is_not():
    """pyxis takes an image argument not starting with / or ./ for a registry image
    (https://github.com/NVIDIA/pyxis/issues/127)."""
    tail = ("pyxis: importing docker image: {}\n"
            "slurmstepd: error: pyxis: couldn't start container\n")
    bare = classify(Evidence(exit_code=1, log_tail=tail.format("hello-world.sqsh")))
    assert (bare.cls, bare.side) == ("bad_config", "user")
    for image in ("./hello-world.sqsh", "/img/hello-world.sqsh", "nvcr.io#nvidia/pytorch:24.01"):
        c = classify(Evidence(exit_code=1, log_tail=tail.format(image)))
        assert c.cls == "container_runtime", image
