"""Classification of failed workers from exit status and log tails."""

from __future__ import annotations

import signal

from slurm_robust.launcher.classify import EXIT_NONFINITE, Evidence, classify, classify_failure


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


# The tests below are written from development entries of the failure corpus added
# later (ids in classify_seen_ids.txt), each excerpt copied here; each rule reads a
# message a tool, library or runtime prints, not a phrase of one thread.

def test_nvml_unknown_error_is_the_container_runtime_not_a_lost_gpu():
    # nvctk-1227-nvml-unknown-after-daemon-reload: systemd rewrote the container's
    # device cgroup; the host's GPU is fine, so reattempt in a new container, no eviction.
    c = classify_failure(None, None, "(container) $ nvidia-smi -L\n"
                                     "Failed to initialize NVML: Unknown Error")
    assert (c.cls, c.side, c.action) == ("container_runtime", "infrastructure",
                                         "reattempt"), c
    # A driver/library mismatch is still the node's GPU stack.
    mismatch = classify_failure(None, None, "Failed to initialize NVML: Driver/library "
                                            "version mismatch")
    assert mismatch.cls == "gpu_unavailable" and mismatch.strength == "hardware", mismatch


def test_a_driver_too_old_for_the_jobs_build_is_a_version_mismatch():
    # trixie-9-driver-too-old-slurm-training: PyTorch's check of its build against the
    # node's driver; either side may move, so the side is unknown and nothing is evicted.
    log = ("AssertionError: \n"
           "The NVIDIA driver on your system is too old (found version 10010).\n"
           "Please update your GPU driver by downloading and installing a new\n"
           "version from the URL: http://www.nvidia.com/Download/index.aspx\n"
           "Alternatively, go to: https://pytorch.org to install")
    c = classify_failure(1, None, log)
    assert (c.cls, c.side) == ("bad_config", "unknown") and not c.evicts, c
    # User space that cannot reach the driver at all is still diagnosed on the node.
    gone = classify_failure(1, None, "NVIDIA-SMI has failed because it couldn't "
                                     "communicate with the NVIDIA driver.")
    assert (gone.cls, gone.side) == ("gpu_unavailable", "unknown"), gone


def test_slurm_refusing_the_request_is_the_jobs_configuration():
    # torchforge-590-sbatch-memory-spec-unsatisfiable: more memory than any node has.
    log = ("sbatch: error: Memory specification can not be satisfied\n"
           "sbatch: error: Batch job submission failed: Requested node configuration is "
           "not available")
    c = classify_failure(None, None, log)
    assert (c.cls, c.side, c.rule) == ("bad_config", "user", "slurm_request_refused"), c


def test_the_open_file_limit_is_a_limit_of_unknown_side():
    # neuralrecon-91-too-many-open-files-dataloader: the limit, or a leak in the job.
    log = ("    raise RuntimeError(\n"
           "RuntimeError: Too many open files. Communication with the workers is no longer "
           "possible. Please increase the limit using `ulimit -n` in the shell or change "
           "the sharing strategy by calling `torch.multiprocessing.set_sharing_strategy("
           "'file_system')` at the beginning of your code")
    c = classify_failure(1, None, log)
    assert (c.cls, c.side) == ("bad_config", "unknown") and not c.evicts, c


def test_object_store_failures_name_remote_storage():
    # scirepeval-48-fsspec-s3-stream-timeout: fsspec's timeout on a streamed S3 file.
    c = classify_failure(1, None, "fsspec.exceptions.FSTimeoutError: Caught FSTimeoutError "
                                  "in DataLoader worker process 1.")
    assert c.cls == "remote_storage" and not c.evicts, c
    # cockpit-bots-3991-s3-503-slow-down: S3's 503 reply to a too-high request rate.
    c = classify_failure(None, None, "     raise HTTPError(req.full_url, code, msg, hdrs, "
                                     "fp)\n urllib.error.HTTPError: HTTP Error 503: Slow "
                                     "Down")
    assert c.cls == "remote_storage", c
    # tf-24357-s3-curl-28-distributed-training: TensorFlow's S3 file system retrying.
    c = classify_failure(None, None, "2018-12-14 01:13:58.715801: E tensorflow/core/"
                                     "platform/s3/aws_logging.cc:60] Curl returned error "
                                     "code 28")
    assert (c.cls, c.side) == ("remote_storage", "unknown"), c


def test_an_error_naming_an_object_store_url_is_remote_storage_not_the_fabric():
    # webdataset-473-s3-pipe-broken-pipe: the broken pipe is the shard download's.
    c = classify_failure(None, None, "download failed: s3://bucket-name/path/to/file.tar "
                                     "to - [Errno 32] Broken pipe")
    assert (c.cls, c.side) == ("remote_storage", "unknown") and not c.secondary, c
    # mosaic-streaming-310-index-json-not-found: the launcher's last line says only that
    # rank 0 crashed; the download error above it names the cause.
    log = ("RuntimeError: Failed to download s3://my_bucket/path/to/data/my_dataset/train/"
           "index.json -> /tmp/tmp95xvpyl_/train/index.json. Got errors:\n"
           "ERROR:composer.cli.launcher:Rank 0 crashed with exit code 1.")
    assert classify_failure(1, None, log).cls == "remote_storage"
    # A URL in a line that reports no failure is not evidence.
    ok = classify_failure(1, None, "Saving checkpoints for 7200 into s3://b/ckpt/model.ckpt")
    assert ok.cls != "remote_storage", ok


def test_a_rocm_gpu_page_fault_is_a_cuda_error_of_unknown_side():
    # hiptf-60-rocm-page-fault-resnet: the HSA runtime's illegal memory access.
    log = ("INFO:tensorflow:loss = 1.00229, step = 901, precision = 0.703125\n"
           "Memory access fault by GPU node-1 on address 0x1e4000. Reason: Page not present "
           "or supervisor privilege.\nAborted (core dumped)")
    c = classify_failure(None, signal.SIGABRT, log)
    assert (c.cls, c.side, c.action) == ("cuda_error", "unknown", "diagnose"), c


def test_a_missing_environment_variable_is_configuration_of_unknown_side():
    # azureml-bert-48-missing-master-node-env: os.environ's KeyError.
    log = ('File "src/scripts/submit_job/distributed.py", line 273, in '
           "set_environment_variables_for_nccl_backend\n"
           "    os.environ['MASTER_ADDR'] = os.environ['AZ_BATCHAI_MPI_MASTER_NODE']\n"
           '  File "/opt/conda/lib/python3.6/os.py", line 669, in __getitem__\n'
           "    raise KeyError(key) from None\n"
           "KeyError: 'AZ_BATCHAI_MPI_MASTER_NODE'")
    c = classify_failure(1, None, log)
    assert (c.cls, c.side) == ("bad_config", "unknown"), c
    # A KeyError from the job's own dict stays the job's exception.
    assert classify_failure(1, None, tb("KeyError: 'lr'")).cls == "user_exception"


def test_hydra_reports_the_jobs_error_without_a_traceback():
    # lightning-hydra-350-error-locating-target.
    log = ("Error executing job with overrides: []\n"
           "Error locating target 'src.models.xxx_module.XXXLitModule', see chained "
           "exception above.\nfull_key: model\n\n"
           "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.")
    c = classify_failure(1, None, log)
    assert c.cls == "user_exception" and c.rule == "hydra_job_error" and not c.evicts, c
    # A cause a rule knows, reported through Hydra, keeps its class.
    oom = "torch.cuda.OutOfMemoryError: CUDA out of memory.\n" + log
    assert classify_failure(1, None, oom).cls == "gpu_oom"


def test_an_extension_built_for_another_library_version_is_the_jobs_environment():
    # flashattn-821-undefined-symbol-torch22-wheel.
    log = ("ImportError: .../test_env/lib/python3.10/site-packages/flash_attn_2_cuda."
           "cpython-310-x86_64-linux-gnu.so: undefined symbol: _ZN2at4_ops5zeros4callEN3"
           "c108ArrayRefINS2_6SymIntEEENS2_8optionalINS2_10ScalarTypeEEENS6_INS2_6Layout"
           "EEENS6_INS2_6DeviceEEENS6_IbEE")
    c = classify_failure(1, None, log)
    assert (c.cls, c.side) == ("bad_config", "user"), c


def test_a_checkpoint_that_does_not_fit_the_model_is_the_jobs_exception():
    # mvdet-7-state-dict-renamed-module.
    log = ('Missing key(s) in state_dict: "map_classifier.0.weight", "map_classifier.0.'
           'bias". \n\nUnexpected key(s) in state_dict: "world_classifier.0.weight", '
           '"world_classifier.0.bias".')
    c = classify_failure(1, None, log)
    assert (c.cls, c.side) == ("user_exception", "user"), c


def test_a_registry_pull_rate_limit_is_an_external_service():
    # ksnip-655-dockerhub-rate-limit-deb-ci: not the container runtime, not the image.
    log = ("Unable to find image 'ubuntu:18.04' locally\n"
           "docker: Error response from daemon: toomanyrequests: You have reached your pull "
           "rate limit. You may increase the limit by authenticating and upgrading: "
           "https://www.docker.com/increase-rate-limit.")
    c = classify_failure(None, None, log)
    assert c.cls == "external_service" and not c.evicts, c


# The tests below read wording families: the first of each is copied from a development
# entry of the failure corpus (ids in classify_seen_ids.txt) where one has it, the others
# are the same library's or tool's other wordings of the same failure.

def test_a_parallel_layout_that_does_not_fit_is_the_jobs_arguments():
    # msswift-5737-layers-not-divisible-by-pp: Megatron's own check of the layout.
    c = classify_failure(1, None, "AssertionError: Number of layers should be divisible by "
                                  "the pipeline-model-parallel size")
    assert (c.cls, c.side, c.rule) == ("bad_config", "user", "parallel_layout"), c
    ds = ("AssertionError: Check batch related parameters. train_batch_size is not equal "
          "to micro_batch_per_gpu * gradient_acc_step * world_size 32 != 4 * 1 * 4")
    assert classify_failure(1, None, ds).rule == "parallel_layout"


def test_argument_parsers_refusing_the_command_line_are_configuration():
    for log in ("usage: train.py [-h] [--lr LR]\ntrain.py: error: unrecognized arguments: "
                "--local-rank=0",
                "train.py: error: the following arguments are required: --data",
                "train.py: error: argument --precision: invalid choice: 'bf17'",
                "FATAL Flags parsing error: Unknown command line flag 'lr'"):
        c = classify_failure(2, None, log)
        assert (c.cls, c.side) == ("bad_config", "user"), (log, c)


def test_a_container_mount_enroot_refuses_is_the_mount_asked_for():
    # pyxis-133-container-mount-path-with-space (enroot-140 the same with EACCES).
    log = ("slurmstepd: error: pyxis: container start failed with error code: 1\n"
           "slurmstepd: error: pyxis: printing enroot log file:\n"
           "slurmstepd: error: pyxis:     enroot-mount: failed to mount: /muw/home/my_user/"
           "foo at /tmp/enroot-data/user-36209/pyxis_479.0/bar: No such file or directory\n"
           "slurmstepd: error: pyxis: couldn't start container")
    c = classify_failure(1, None, log)
    assert (c.cls, c.side) == ("bad_config", "unknown") and not c.evicts, c
    # A container that fails to start for another reason is still the runtime's.
    other = "\n".join(line for line in log.splitlines() if "enroot-mount" not in line)
    assert classify_failure(1, None, other).cls == "container_runtime"


def test_a_transport_retry_exceeded_is_the_fabric_or_the_jobs_gid_of_unknown_side():
    # nccl-426-roce-gid-index-error12: NCCL_IB_GID_INDEX fixed it; elsewhere a bad link.
    c = classify_failure(None, None, "-worker-1:946:988 [0] transport/net_ib.cc:839 NCCL "
                                     "WARN NET/IB : Got completion with error 12, opcode 1, "
                                     "len 0, vendor err 129")
    assert (c.cls, c.side, c.action) == ("network", "unknown", "diagnose"), c
    assert classify_failure(None, None, "NCCL WARN NET/IB : Got async event : port "
                                        "error").side == "infrastructure"


def test_an_indented_kernel_panic_is_still_the_kernels():
    # sonic-17358-softlockup-kernel-panic: the panic that follows the soft lockup decides.
    log = ("                  [ 5300.229390] watchdog: BUG: soft lockup - CPU#2 stuck for "
           "23s! [kworker/2:1:25629]\n"
           "                  [ 5300.237965] Kernel panic - not syncing: softlockup: hung "
           "tasks")
    assert classify_failure(None, None, log).cls == "kernel_panic"


def test_a_quoted_or_marked_up_traceback_is_still_the_exception():
    # flowtron-116-keyerror-iteration: the traceback quoted with "> " in a report.
    log = (">   File \"train.py\", line 110, in load_checkpoint\n"
           ">     iteration = checkpoint_dict['iteration']\n"
           "> KeyError: 'iteration'")
    c = classify_failure(1, None, log)
    assert (c.cls, c.side) == ("user_exception", "user") and c.line == "KeyError: 'iteration'"
    assert classify_failure(1, None, "`RuntimeError: boom`").cls == "user_exception"


def test_host_memory_wordings_are_cpu_oom_and_gpu_wordings_gpu_oom():
    host = ("slurmstepd: error: Exceeded job memory limit",
            "RuntimeError: [enforce fail at CPUAllocator.cpp:64] . DefaultCPUAllocator: "
            "can't allocate memory: you tried to allocate 34359738368 bytes.",
            "OSError: [WinError 1455] The paging file is too small for this operation to "
            "complete",
            "java.lang.OutOfMemoryError: Java heap space",
            "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low "
            "on memory.",
            "Reason: OOMKilled")
    for log in host:
        assert classify_failure(1, None, log).cls == "cpu_oom", log
    gpu = ("NCCL WARN Cuda failure 'out of memory'",
           "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while "
           "trying to allocate 1073741824 bytes.",
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB")
    for log in gpu:
        assert classify_failure(1, None, log).cls == "gpu_oom", log


def test_framework_finiteness_checks_are_nan():
    for log in ("tensorflow.python.framework.errors_impl.InvalidArgumentError: "
                "loss : Tensor had NaN values",
                "Batch 1203: Invalid loss, terminating training",
                "RuntimeError: The total norm of order 2.0 for gradients from `parameters` "
                "is non-finite, so it cannot be clipped.",
                "ValueError: Expected parameter loc (Tensor of shape (64, 8)) of distribution "
                "Normal(loc: torch.Size([64, 8]), scale: torch.Size([64, 8])) to satisfy the "
                "constraint Real(), but found invalid values:"):
        assert classify_failure(1, None, log).cls == "nan", log


def test_tensorflows_histogram_summary_of_a_non_finite_value_is_nan():
    # tflearn-304-nan-summary-histogram-adam, cyclegan-68-nan-summary-dx-fake,
    # tfmodels-9986-nan-kernel-histogram-unet, ssdtf-27-nan-summary-lower-lr: the summary
    # op refuses a NaN weight or activation; it was read as an unknown exception (or,
    # quoted, as nothing at all).
    for log in ("InvalidArgumentError: Nan in summary histogram for: Adam/HistogramSummary",
                "InvalidArgumentError (see above for traceback): **Nan in summary histogram "
                "for: D_X/fake**\n\t [[Node: D_X/fake = HistogramSummary[T=DT_FLOAT, "
                "_device=\"/job:localhost/replica:0/task:0/cpu:0\"](D_X/fake/tag, "
                "D_X_4/output/add/_1361)]]",
                "InvalidArgumentError: Nan in summary histogram for: conv2d/kernel_0 "
                "[Op:WriteHistogramSummary]",
                "'...tensorflow.python.framework.errors_impl.InvalidArgumentError: Nan in "
                "summary histogram for: filter_summaries/conv1_1'"):
        c = classify_failure(1, None, log)
        assert (c.cls, c.rule) == ("nan", "nan"), (log, c)
    # A summary that is written, or one that is refused for another reason, is no NaN.
    for log in ("INFO:tensorflow:Summary name conv1/weights:0 is illegal; using "
                "conv1/weights_0 instead.",
                "InvalidArgumentError: tags and values not the same shape: [] != [64] "
                "(tag 'histogram summary')"):
        assert classify_failure(1, None, log).cls != "nan", log


def test_a_build_that_does_not_fit_is_the_jobs_environment():
    for log in ("AssertionError: Torch not compiled with CUDA enabled",
                "RuntimeError: Distributed package doesn't have NCCL built in",
                "RuntimeError: FlashAttention only supports Ampere GPUs or newer.",
                "ImportError: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.32' not "
                "found"):
        c = classify_failure(1, None, log)
        assert (c.cls, c.side) == ("bad_config", "user"), (log, c)
    lib = classify_failure(1, None, "ImportError: libcudnn.so.8: cannot open shared object "
                                    "file: No such file or directory")
    assert (lib.cls, lib.side) == ("bad_config", "unknown"), lib
    # NCCL's INFO line about its optional network plugin is no missing library.
    info = ("node0:13571:13571 [0] NCCL INFO NET/Plugin : Plugin load (libnccl-net.so) "
            "returned 2 : libnccl-net.so: cannot open shared object file: No such file or "
            "directory\nRuntimeError: NCCL error in: ProcessGroupNCCL.cpp:825, unhandled "
            "system error, NCCL version 2.7.8")
    assert classify_failure(1, None, info).cls == "network"


def test_a_path_the_job_named_that_does_not_exist_is_configuration():
    # fdnet-5-checkpoint-missing-train-flag: a checkpoint the arguments never kept.
    c = classify_failure(1, None, "FileNotFoundError: [Errno 2] No such file or directory: "
                                  "'./checkpoints/FDNet_ETTh1_ftM_ll672_pl720_0/checkpoint.pth'")
    assert (c.cls, c.side, c.rule) == ("bad_config", "unknown", "missing_path"), c
    # A rename that loses a race between ranks stays the code's exception
    # (dalle-pytorch-141-ranks-race-cache-rename).
    race = classify_failure(1, None, "FileNotFoundError: [Errno 2] No such file or directory: "
                                     "'/root/.cache/dalle/tmp.encoder.pkl' -> "
                                     "'/root/.cache/dalle/encoder.pkl'")
    assert race.cls == "user_exception", race


def test_the_kernel_modules_api_mismatch_is_a_gpu_the_node_cannot_use():
    # stackhpc-287-nvrm-api-mismatch: a driver updated and its kernel module not reloaded,
    # the same state as NVML's "Driver/library version mismatch".
    log = ("Jun 30 11:07:05 gpu-0 kernel: NVRM: API mismatch: the client has the version "
           "535.54.03, but#012NVRM: this kernel module has the version 530.30.02.  Please"
           "#012NVRM: make sure that this kernel module and all NVIDIA driver#012NVRM: "
           "components have the same version.")
    c = classify_failure(None, None, log)
    assert (c.cls, c.rule) == ("gpu_unavailable", "gpu_gone"), c
    # nvidiadocker-182: the kernel's multi-line wording, its last line alone says nothing.
    wrapped = ("Aug 26 14:08:07 nyasara-linux kernel: NVRM: API mismatch: the client has the "
               "version 367.44, but\n    NVRM: this kernel module has the version 367.35.  "
               "Please\n    NVRM: components have the same version.")
    assert classify_failure(None, None, wrapped).cls == "gpu_unavailable"


def test_an_uncorrectable_nvlink_error_outranks_the_socket_errors_beside_it():
    # pytorch-58155-uncorrectable-nvlink-terminate: "Transport endpoint is not connected"
    # is a rank's socket here, not a FUSE mount; the NVLink report names the fault.
    log = ("terminate called after throwing an instance of 'std::system_error'\n"
           "  what():  Transport endpoint is not connected\n"
           "terminate called after throwing an instance of 'c10::Error'\n"
           "  what():  CUDA error: uncorrectable NVLink error detected during the execution")
    c = classify_failure(None, signal.SIGABRT, log)
    assert (c.cls, c.side, c.rule) == ("cuda_error", "unknown", "nvlink_uncorrectable"), c
    assert not c.evicts


def test_a_task_dump_in_uninterruptible_sleep_is_a_hang_not_a_panic():
    # returnn-1480-uvm-ioctl-hung-task: a dmesg -H copy without the "INFO: task ...
    # blocked" header; the call trace belongs to the stuck task.
    log = ("[  +0.000049] task:python3.11      state:D stack:    0 pid:15277 ppid: 15257 "
           "flags:0x00000002\n[  +0.000006] Call Trace:\n[  +0.000003]  <TASK>\n"
           "[  +0.000004]  __schedule+0x23d/0x590\n"
           "[  +0.000005]  uvm_page_tree_get_ptes_async+0x93/0x970 [nvidia_uvm]")
    c = classify_failure(None, None, log)
    assert (c.cls, c.side, c.rule) == ("job_hang", "unknown", "d_state_task"), c
    # The same dump with kernel timestamps is still no panic.
    stamped = "\n".join("[ 1234.5] " + line.split("] ", 1)[1] for line in log.splitlines())
    assert classify_failure(None, None, stamped).cls == "job_hang"


def test_the_kubelet_evicting_for_node_pressure_is_the_nodes_disk_or_memory():
    # hushhouse-8-evicted-ephemeral-storage, operatefirst-1352-diskpressure-evictions,
    # kubefate-64-evicted-node-low-memory.
    disk = ("  message: 'The node was low on resource: ephemeral-storage. Container worker\n"
            "    was using 73712Ki, which exceeds its request of 0. '\n  reason: Evicted")
    pressure = ("build-log-clustering-56b4b9d9vsk56   ds-ml   Evicted   oct-03-09-compute   "
                "Pod The node had condition: [DiskPressure].")
    memory = ("4m11s  Warning  Evicted  pod/egg-1  The node was low on resource: memory. "
              "Container egg was using 5053216Ki, which exceeds its request of 0.")
    for log, cls in ((disk, "disk_full"), (pressure, "disk_full"), (memory, "cpu_oom")):
        c = classify_failure(None, None, log)
        assert (c.cls, c.side) == (cls, "unknown") and not c.evicts, (log, c)


def test_an_adapters_async_event_is_the_fabric_not_a_memlock_limit():
    # nccl-230-ib-local-catastrophic: the verbs call failing after the event is no
    # configuration error.
    log = ("host:815:864 [0] transport/net_ib.cu:80 NCCL WARN NET/IB : Got async event : "
           "local catastrophic error\n"
           "host:815:864 [0] misc/ibvwrap.cu:220 NCCL WARN Call to ibv_get_async_event failed")
    c = classify_failure(None, None, log)
    assert (c.cls, c.rule) == ("network", "ib_async_event"), c
    assert classify_failure(None, None, "NCCL WARN NET/IB : Got async event : port error"
                            ).cls == "network"


def test_a_container_image_that_cannot_be_unpacked_is_the_container_runtime():
    # trinotate-100-sif-extract-no-space: the space that ran out is the runtime's
    # staging directory, and the container never started.
    log = ("INFO:    Converting SIF file to temporary sandbox...\n"
           "FATAL:   while extracting /home/u/trinotate.v4.0.0.simg: root filesystem "
           "extraction failed: failed to copy content in staging file: write /tmp/rootfs-1/"
           "archive-2: no space left on device")
    c = classify_failure(None, None, log)
    assert (c.cls, c.rule) == ("container_runtime", "container_start"), c


def test_a_parallel_file_systems_mount_failure_is_a_mount():
    # dataacc-119-lustre-mount-busy
    log = ("mount.lustre: mount dac-e-19-opa@o2ib1:/RTsjlttY at /mnt/dac/6038_job failed: "
           "Device or resource busy\nIs the backend filesystem mounted?\n"
           "Check /etc/mtab and /proc/mounts")
    assert classify_failure(None, None, log).cls == "filesystem_mount"


def test_object_store_server_errors_from_other_clients_are_remote_storage():
    # victoriametrics-403-gcs-503-backend, rclone-550-gcs-500-backend,
    # gcsfuse-408-readfileop-503, azsdkpy-24636-download-stream-reset.
    for log in ("daily backup failed. On all three storage nodes with `googleapi: Error 503: "
                "Backend Error`",
                "2016/06/28 12:45:39 E9E/B0F1: Failed to copy: googleapi: Error 500: Backend "
                "Error, backendError",
                "fuseops.ReadFileOp error: fh.reader.ReadAt: startRead: NewReader: googleapi: "
                "got HTTP response code 503 with body: Backend Error",
                "2022-05-27T21:51:42+0000 __next__():186 Unable to stream download: "
                "(\"Connection broken: ConnectionResetError(104, 'Connection reset by peer')"
                "\", ConnectionResetError(104, 'Connection reset by peer'))\n"
                "2022-05-27T21:51:42+0000 wrapped():79 Download stream interrupted."):
        c = classify_failure(None, None, log)
        assert c.cls == "remote_storage" and not c.evicts, (log, c)
    # A 4xx from a Google API is no server error of the store: no rule reads it as one.
    # (The learned fallback may still guess the class from the words, blaming nobody.)
    forbidden = Evidence(log_tail="googleapi: Error 403: Forbidden")
    assert classify(forbidden, learned=False).cls != "remote_storage"
    guess = classify(forbidden)
    assert guess.rule in ("learned", "exit_status") and guess.side == "unknown"


def test_a_libfabric_providers_failed_completion_is_the_fabric_of_unknown_side():
    # awsofinccl-346-efa-invalid-address; a provider's warning that is no error is not.
    log = ("libfabric:451707:1708520807::efa:cq:efa_rdm_txe_handle_error():737<warn> err: 5, "
           "message: Invalid address My EFA addr: fi_addr_efa://[fe80::13]:0:1072483550")
    c = classify_failure(None, None, log)
    assert (c.cls, c.side, c.rule) == ("network", "unknown", "ofi_fabric"), c
    info = ("libfabric:462:1673041636:efa:core:rxr_info_to_rxr():506<warn> FI_HMEM "
            "capability requires RDMA, which this device does not support.")
    assert classify_failure(None, None, info).rule != "ofi_fabric"


def test_a_numpy_binary_incompatibility_is_the_jobs_environment():
    # atrain-10-numpy2-incompatible; loraeasy-220-numpy2-broke-last-week is the same
    # words right after a recorded change, so the change's.
    log = ("A module that was compiled using NumPy 1.x cannot be run in\n"
           "NumPy 2.0.0 as it may crash. To support both 1.x and 2.x\n"
           "AttributeError: `np.NaN` was removed in the NumPy 2.0 release. Use `np.nan` "
           "instead.. Did you mean: 'nan'?")
    c = classify_failure(1, None, log)
    assert (c.cls, c.side) == ("bad_config", "user"), c
    changed = classify(Evidence(log_tail="The first line of the command line is: A module "
                                "that was compiled using NumPy 1.x cannot be run in.",
                                change_recorded=True))
    assert changed.cls == "code_data_change", changed


def test_a_loss_scale_driven_down_and_the_scalers_floor_are_nan():
    # fairseq-512-overflow-loss-scale-chain (fairseq's "setting loss scale to: X"),
    # fairseq-282-bigger-lr-min-loss-scale, dle-543-bert-nan-loss-scale (a scale that
    # only ever falls), jointre-7-dynet-gradient-bad-nan.
    fairseq = ("| WARNING: overflow detected, setting loss scale to: 0.00048828125\n"
               "| WARNING: overflow detected, setting loss scale to: 0.000244140625\n"
               "| WARNING: overflow detected, setting loss scale to: 0.0001220703125\n"
               "Traceback (most recent call last):")
    floor = ("I have encountered “Exception: Minimum loss scale reached ” error several "
             "times with fp16 training.")
    falling = "\n".join(f"DLL 2020-05-28 08:5{i}:00.1 - PARAMETER loss_scale : {2.0 ** (19 - i)} "
                        for i in range(7))
    dynet = "RuntimeError: Magnitude of gradient is bad: -nan"
    for log in (fairseq, floor, falling, dynet):
        assert classify_failure(None, None, log).cls == "nan", log
    # A scaler that halves now and then and grows back is routine, and a steady scale
    # says nothing.
    routine = "\n".join(f"iteration {i} | loss scale: {s} | loss 2.1"
                        for i, s in enumerate((1024.0, 512.0, 1024.0, 512.0, 1024.0, 2048.0,
                                               1024.0, 2048.0)))
    steady = "\n".join(f"iteration {i} | loss scale: 1.0 | lm loss: 2.1" for i in range(9))
    for log in (routine, steady):
        assert classify_failure(None, None, log).cls != "nan", log


def test_an_object_store_refusing_the_request_is_the_jobs_credentials_or_request():
    # lbhackney-1883-iam-not-authorized-putobject, amazonaws-1502-bucket-does-not-allow-acls:
    # botocore in the line is no longer enough to blame the store.
    for log in ("> botocore.exceptions.ClientError: An error occurred (AccessDenied) when "
                "calling the PutObject operation: User: arn:aws:iam::120038763019:user/airflow "
                "is not authorized to perform: s3:PutObject on resource: \"arn:aws:s3:::landing/\"",
                "botocore.exceptions.ClientError: An error occurred "
                "(AccessControlListNotSupported) when calling the PutObject operation: The "
                "bucket does not allow ACLs"):
        c = classify_failure(1, None, log)
        assert (c.cls, c.side, c.rule) == ("remote_storage", "user", "object_store_refused"), c
    # The store's own load is still not the job's (cccrawlstats-31-s3-slowdown-getobject).
    slow = classify_failure(1, None, "download failed: s3://cc/part-00000.gz to part.gz An "
                                     "error occurred (SlowDown) when calling the GetObject "
                                     "operation (reached max retries: 2): Please reduce your "
                                     "request rate.")
    assert slow.cls == "remote_storage" and slow.side != "user", slow


def test_torchvision_built_for_another_cuda_than_torch_is_the_jobs_environment():
    # kohyatrainer-164-torchvision-cuda-mismatch
    log = ("RuntimeError: Detected that PyTorch and torchvision were compiled with different "
           "CUDA versions. PyTorch has CUDA Version=11.7 and torchvision has CUDA Version=11.6. "
           "Please reinstall the torchvision that matches your PyTorch install.")
    c = classify_failure(1, None, log)
    assert (c.cls, c.side, c.rule) == ("bad_config", "user", "build_mismatch"), c


def test_a_pod_ended_for_its_nodes_shutdown_is_a_lost_node():
    # argo-9880-gke-imminent-node-shutdown: a preemptible node reclaimed.
    log = ("During actual pre-emption, we see `WorkflowNodeFailed` - `Pod was terminated due "
           "to imminent node shutdown` and does not trigger our retry policy.")
    c = classify_failure(None, None, log)
    assert (c.cls, c.side) == ("node_lost", "infrastructure"), c


def test_other_batch_schedulers_limit_kills_are_the_jobs_request():
    # cbiocluster-256, canu-444, qiime-1048 (time); souporcell-20, sarek-541 (memory);
    # payu-587 (the node-local scratch quota, side unknown).
    for log in ("Aborted by PBS Server\nJob exceeded its walltime limit. Job was aborted\n"
                "See Administrator for help\nExit_status=-11",
                "TERM_RUNLIMIT: job killed after reaching LSF run time limit.\n"
                "Exited with exit code 140.",
                "=>> PBS: job killed: walltime 259217 exceeded limit 259200"):
        c = classify_failure(None, None, log)
        assert (c.cls, c.side) == ("bad_config", "user"), (log, c)
    for log in ("TERM_MEMLIMIT: job killed after reaching LSF memory usage limit.\n"
                "Exited with exit code 143.",
                "Aborted by PBS Server\nJob exceeded a memory resource limit (vmem, pvmem, etc.). "
                "Job was aborted\nExit_status=-10",
                "=>> PBS: job killed: mem 38427376kb exceeded limit 33554432kb"):
        c = classify_failure(None, None, log)
        assert (c.cls, c.side) == ("cpu_oom", "user"), (log, c)
    quota = classify_failure(None, None, "Job 143560526.gadi-pbs killed due to exceeding "
                                         "jobfs quota. Quota: 15.0GB, Used: 15.0GB, Host: cpu-1")
    assert (quota.cls, quota.side) == ("disk_full", "unknown"), quota


def test_a_kernel_oops_with_the_journals_precise_timestamps_is_the_kernels():
    # tf-26653-nvidia-oops-during-session (journalctl -o short-precise).
    log = ("Mar 13 11:01:55.588061 myhostname kernel: BUG: unable to handle kernel paging "
           "request at ffffbb9c52edfdb8\n"
           "Mar 13 11:01:55.594839 myhostname kernel: Oops: 0000 [#2] PREEMPT SMP PTI\n"
           "Mar 13 11:01:55.594871 myhostname kernel: CPU: 4 PID: 1334 Comm: nvidia-smi "
           "Tainted: P      D    OE     5.0.0-arch1-1-ARCH #1")
    c = classify_failure(None, None, log)
    assert (c.cls, c.rule) == ("kernel_panic", "kernel_panic"), c


def test_cublas_unable_to_create_its_handle_is_most_often_a_full_gpu():
    # lmeval-1689-cublas-not-initialized-memory (more GPUs fixed it),
    # qwen-120-cublas-not-initialized-memory; side unknown, since an out-of-range index or
    # a broken CUDA setup print the same (llama2c-279).
    c = classify_failure(1, None, "RuntimeError: CUDA error: CUBLAS_STATUS_NOT_INITIALIZED "
                                  "when calling `cublasCreate(handle)`")
    assert (c.cls, c.side, c.rule) == ("gpu_oom", "unknown", "cublas_handle"), c
    assert not c.evicts


def test_a_kernel_killed_by_the_display_watchdog_is_the_machines_setting():
    # pointwise-9-cuda-launch-timeout-os-limit
    log = ("2018-11-06 11:32:27.452268: E tensorflow/stream_executor/cuda/cuda_event.cc:48] "
           "Error polling for event status: failed to query event: CUDA_ERROR_LAUNCH_TIMEOUT: "
           "the launch timed out and was terminated\n"
           "2018-11-06 11:32:27.452292: F tensorflow/core/common_runtime/gpu/gpu_event_mgr.cc:"
           "274] Unexpected Event status: 1")
    c = classify_failure(None, signal.SIGABRT, log)
    assert (c.cls, c.side, c.rule) == ("bad_config", "unknown", "launch_timeout"), c


def test_an_http_download_cut_off_by_the_server_is_an_external_service():
    # hfhub-2199-incompleteread-download
    c = classify_failure(None, None, "Error on *.from_pretrained call: Unexpected ('Connection "
                                     "broken: IncompleteRead( 443")
    assert (c.cls, c.side) == ("external_service", "unknown"), c


def test_xlas_device_memory_words_are_a_gpu_oom_and_its_quota_status_is_not():
    # easydel-78-tpu-hbm-exceeded (the compiler's HBM budget),
    # gemma-85-jax-device-buffer-residual (the runtime's device buffers).
    for line in ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile "
                 "permanent error. Ran out of memory in memory space hbm. Used 21.90G of "
                 "7.48G hbm. Exceeded hbm capacity by 14.42G.",
                 "`jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Error allocating "
                 "device buffer: Attempting to allocate 15.65G. That was not possible. There "
                 "are 11.08G free.; (0x0x0_HBM0)`"):
        c = classify_failure(1, None, line)
        assert (c.cls, c.rule) == ("gpu_oom", "gpu_oom"), c
    # gRPC's RESOURCE_EXHAUSTED is a quota, not memory: the status word alone decides nothing.
    quota = classify_failure(1, None, "google.api_core.exceptions.ResourceExhausted: 429 "
                                      "RESOURCE_EXHAUSTED: Quota exceeded for quota metric")
    assert quota.cls != "gpu_oom", quota


def test_lightnings_device_count_check_is_the_jobs_request_unless_no_gpu_is_visible():
    # sleap-2642-requested-seven-gpus-has-two
    c = classify_failure(1, None, "lightning.fabric.utilities.exceptions."
                                  "MisconfigurationException: You requested gpu: [0, 1, 2, "
                                  "3, 4, 5, 6] But your machine only has: [0, 1]")
    assert (c.cls, c.side, c.rule) == ("bad_config", "user", "framework_misconfig"), c
    assert not c.evicts
    # No GPU visible at all: a lost GPU looks the same from inside, so the side is left
    # to diagnosis, as for "No CUDA GPUs are available".
    none = classify_failure(1, None, "pytorch_lightning.utilities.exceptions."
                                     "MisconfigurationException: \n"
                                     "                You requested GPUs: [0]\n"
                                     "                But your machine only has: []")
    assert (none.cls, none.side, none.rule) == ("bad_config", "unknown", "no_gpu"), none


def test_the_cuda_runtimes_insufficient_driver_is_a_mismatch_either_side_may_fix():
    # niuzhiheng-caffe-33-driver-insufficient-old-driver: updating the machine's driver
    # fixed it; the same words come from a job built for a newer CUDA than the node's.
    c = classify_failure(None, signal.SIGABRT,
                         "\"Check failed: error == cudaSuccess (35 vs. 0) CUDA driver version "
                         "is insufficient for CUDA runtime version\"")
    assert (c.cls, c.side, c.rule) == ("bad_config", "unknown", "driver_too_old"), c
    assert not c.evicts


def test_azure_storages_client_errors_are_remote_storage_of_unknown_side():
    # mxfaas-4-azure-blob-account-disabled (the client's exception under its own frames),
    # mxfaas-14-azure-blob-connect-timeout (a storage endpoint that does not answer).
    refused = classify_failure(1, None, "  File \"/usr/local/lib/python3.8/dist-packages/azure/"
                                        "storage/blob/_shared/response_handlers.py\", line 189, "
                                        "in process_storage_error\n"
                                        "    exec(\"raise error from None\")   # pylint: "
                                        "disable=exec-used # nosec\n"
                                        "  File \"<string>\", line 1, in <module>\n"
                                        "azure.core.exceptions.HttpResponseError: The specified "
                                        "account is disabled.\n"
                                        "RequestId:32d7912c-601e-0011-0862-b2b16b000000\n"
                                        "Time:2023-07-09T12:39:32.0469709Z\n"
                                        "ErrorCode:AccountIsDisabled")
    assert (refused.cls, refused.side, refused.rule) == ("remote_storage", "unknown",
                                                         "azure_storage"), refused
    assert refused.line.startswith("azure.core.exceptions.HttpResponseError"), refused.line
    unreachable = classify_failure(1, None, "azure.core.exceptions.ServiceRequestError: "
                                            "(<urllib3.connection.HTTPSConnection object at "
                                            "0x7ff8343d71c0>, 'Connection to serverlesscache."
                                            "blob.core.windows.net timed out. (connect "
                                            "timeout=20)')")
    assert (unreachable.cls, unreachable.side) == ("remote_storage", "unknown"), unreachable
    # azure-core serves every Azure SDK: its exception alone names no store.
    vault = classify_failure(1, None, "azure.core.exceptions.ClientAuthenticationError: "
                                      "Authentication failed for the key vault")
    assert vault.rule != "azure_storage", vault


def test_the_cuda_runtimes_system_not_ready_is_a_node_that_cannot_run_cuda():
    # ollama-12136-cuda-init-fabric-manager: the fabric manager did not match the driver.
    for line in ("> > ggml_cuda_init: failed to initialize CUDA: system not yet initialized",
                 "cuInit failed: CUDA_ERROR_SYSTEM_NOT_READY"):
        c = classify_failure(None, None, line)
        assert (c.cls, c.side, c.rule) == ("gpu_unavailable", "unknown",
                                           "cuda_system_not_ready"), c
        # the library's word, not a hardware report: diagnosis before any eviction
        assert c.action == "diagnose" and not c.evicts, c


def test_nccls_own_cuda_failure_is_a_cuda_error_unless_it_ran_out_of_memory():
    # nccl-1488-nvls-invalid-argument-fm-restart: NVLS memory after a fabric-manager restart.
    c = classify_failure(None, None, "node23:12098:12141 [2] transport/nvls.cc:244 NCCL WARN "
                                     "Cuda failure 1 'invalid argument'")
    assert (c.cls, c.side, c.rule) == ("cuda_error", "unknown", "cuda"), c
    oom = classify_failure(None, None, "node23:12098:12141 [2] NCCL WARN Cuda failure 2 "
                                       "'out of memory'")
    assert (oom.cls, oom.rule) == ("gpu_oom", "gpu_oom"), oom


def test_a_libfabric_providers_input_output_error_is_the_fabric_not_a_disk():
    # libfabric-6249-efa-eq-write-abort: EFA's RxR protocol relays a failed completion as
    # "err: Input/output error (5)"; read as a disk it would evict a healthy node.
    c = classify_failure(None, signal.SIGABRT,
                         "Unable to write to EQ: Missing or unavailable event queue. err: "
                         "Input/output error (5) prov_errno: Unknown error -12 (-12) "
                         "prov/efa/src/rxr/rxr.h:1343")
    assert (c.cls, c.side, c.rule) == ("network", "unknown", "ofi_provider"), c
    assert not c.evicts
    disk = classify_failure(1, None, "OSError: [Errno 5] Input/output error")
    assert (disk.cls, disk.rule) == ("disk_fault", "io_error"), disk


def test_a_c_library_or_nccl_missing_from_the_jobs_environment_is_its_build():
    # pirender-21-glibcxx-conda-libstdcxx: the version named without its quotes.
    glibcxx = classify_failure(1, None, "`ImportError: /miniconda3/envs/PIRender/lib/python3.6/"
                                        "site-packages/torch/lib/../../../.././libstdc++.so.6: "
                                        "version GLIBCXX_3.4.29 not found (required by .cache/"
                                        "torch_extensions/nvdiffrast_plugin/"
                                        "nvdiffrast_plugin.so)`")
    assert (glibcxx.cls, glibcxx.side, glibcxx.rule) == ("bad_config", "user",
                                                         "build_mismatch"), glibcxx
    # lwm-44-xla-unable-to-load-nccl: XLA's collectives with no NCCL library installed.
    line = ("2024-02-23 23:00:08.992499: E external/xla/xla/pjrt/pjrt_stream_executor_client.cc"
            ":2732] Execution of replica 0 failed: INTERNAL: Failed to execute XLA Runtime "
            "executable: run time error: custom call 'xla.gpu.reduce_scatter' failed: external/"
            "xla/xla/service/gpu/nccl_utils.cc:134: NCCL operation ncclGetUniqueId(&id) failed: "
            "Unable to load NCCL library. Multi-GPU collectives will not work.. Last NCCL "
            "warning(error) log entry (may be unrelated) 'Unable to load NCCL library. "
            "Multi-GPU collectives will not work.'.; current tracing scope: "
            "reduce-scatter-start.4; current profiling annotation: XlaModule:#hlo_module="
            "pjit_fn,program_id=50#.")
    nccl = classify_failure(None, None, line)
    assert (nccl.cls, nccl.side, nccl.rule) == ("bad_config", "user", "build_mismatch"), nccl
    # jax-18391-unable-to-load-nccl-after-upgrade: the same words right after the job's
    # jax upgrade are that change's.
    changed = classify(Evidence(exit_code=1, change_recorded=True,
                                log_tail="external/xla/xla/service/gpu/nccl_utils.cc:133: NCCL "
                                         "operation ncclGetUniqueId(&id) failed: Unable to "
                                         "load NCCL library. Multi-GPU collectives will not "
                                         "work.;"))
    assert changed.cls == "code_data_change", changed


def test_eio_on_a_line_naming_a_shared_file_systems_path_is_that_storage_in_either_order():
    # pnfs-44-fsync-eio: coreutils names the path before the errno; the parallel NFS was
    # at fault, and a disk-fault reading would have evicted a healthy client.
    c = classify_failure(1, None, "() [jbent@h9 ~]$ dd if=/dev/urandom of=/mnt/pnfs/jbent/"
                                  "manual.bin bs=3901 count=1 conv=fsync\n"
                                  "ls -l /mnt/pnfs/jbent/manual.bin\n"
                                  "dd: fsync failed for '/mnt/pnfs/jbent/manual.bin': "
                                  "Input/output error")
    assert (c.cls, c.rule) == ("remote_storage", "remote_io"), c
    assert not c.evicts
    first = classify_failure(1, None, "OSError: [Errno 5] Input/output error: '/lustre/scratch/"
                                      "ckpt/step_100.pt'")
    assert (first.cls, first.rule) == ("remote_storage", "remote_io"), first
    # no shared path on the line: the node's own disk stays the reading
    local = classify_failure(1, None, "dd: fsync failed for '/tmp/x.bin': Input/output error")
    assert (local.cls, local.rule) == ("disk_fault", "io_error"), local


# The library-vocabulary rules: each library's or tool's own words for a failure family,
# written from the library's error list (cudaGetErrorString, errno, huggingface_hub's
# exceptions, the kubelet's eviction messages), not from any corpus entry.

def test_the_cuda_runtimes_build_and_driver_mismatches_are_mismatches_of_unknown_side():
    for text in ("CUDA error: system has unsupported display driver / cuda driver combination",
                 "RuntimeError: CUDA error: the provided PTX was compiled with an unsupported "
                 "toolchain.",
                 "cudaErrorStubLibrary: CUDA driver is a stub library"):
        c = classify_failure(1, None, text)
        assert (c.cls, c.side, c.rule) == ("bad_config", "unknown", "driver_too_old"), text
        assert not c.evicts


def test_a_corrupt_file_system_is_a_disk_fault_and_an_evicted_client_a_mount():
    c = classify_failure(1, None, "OSError: [Errno 117] Structure needs cleaning: "
                                  "'/scratch/ckpt/step_400'")
    assert (c.cls, c.side, c.rule) == ("disk_fault", "unknown", "fs_corrupt"), c
    assert not c.evicts
    m = classify_failure(1, None, "OSError: [Errno 108] Cannot send after transport endpoint "
                                  "shutdown: '/lustre/proj/data/shard-00017.bin'")
    assert (m.cls, m.rule) == ("filesystem_mount", "mount"), m
    r = classify_failure(1, None, "OSError: [Errno 121] Remote I/O error")
    assert (r.cls, r.rule) == ("remote_storage", "remote_io"), r


def test_the_hub_refusing_the_jobs_credentials_or_names_is_the_jobs():
    for text in ("huggingface_hub.errors.GatedRepoError: 403 Client Error. Cannot access "
                 "gated repo for url https://huggingface.co/meta-llama/Llama-2-7b/resolve/"
                 "main/config.json.",
                 "huggingface_hub.utils._errors.RepositoryNotFoundError: 401 Client Error. "
                 "Repository Not Found for url: https://huggingface.co/api/models/org/x.",
                 "datasets.exceptions.DatasetNotFoundError: Dataset 'org/x' doesn't exist on "
                 "the Hub or cannot be accessed."):
        h = classify_failure(1, None, text)
        assert (h.cls, h.side, h.rule) == ("bad_config", "user", "hub_refused"), text
    # the Hub down is still the service's
    down = classify_failure(1, None, "requests.exceptions.HTTPError: 503 Server Error: Service "
                                     "Unavailable for url: https://huggingface.co/api/models/x")
    assert down.cls == "external_service", down


def test_a_pod_over_its_own_ephemeral_storage_limit_is_the_jobs_full_disk():
    c = classify_failure(None, 9, "Warning  Evicted  kubelet  Pod ephemeral local storage "
                                  "usage exceeds the total limit of containers 10Gi.")
    assert (c.cls, c.side, c.rule) == ("disk_full", "user", "pod_storage_limit"), c
    assert not c.evicts


def test_eacces_is_a_setting_of_unknown_side_unless_a_container_refused():
    c = classify_failure(1, None, "PermissionError: [Errno 13] Permission denied: "
                                  "'/shared/runs/exp7/checkpoint-500'")
    assert (c.cls, c.side, c.rule) == ("bad_config", "unknown", "permission_denied"), c
    shm = classify_failure(1, None, "OSError: [Errno 13] Permission denied: '/dev/shm/"
                                    "torch_4242_1'")
    assert shm.cls == "container_runtime", shm
    # beside a library's own error the words are noise (a shell profile it could not read)
    beside = classify_failure(1, None, "bash: /etc/profile.d/x.sh: Permission denied\n"
                                       "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1269, "
                                       "remote process exited or there was a network error")
    assert (beside.cls, beside.rule) == ("network", "fabric"), beside
    addr = classify_failure(1, None, "OSError: [Errno 99] Cannot assign requested address")
    assert (addr.cls, addr.side, addr.rule) == ("bad_config", "unknown", "port"), addr


# Rules from the eighth batch's development misses (excerpts from those entries).

def test_a_rendezvous_the_client_cannot_reach_is_the_jobs_setup_of_unknown_side():
    # llamafactory-3715-c10d-connect-wrong-master-addr: MASTER_ADDR set to a netmask.
    c = classify_failure(None, None, "[W socket.cpp:663] [c10d] The client socket has failed "
                                     "to connect to [::ffff:255.255.0.0]:29500 (errno: 110 - "
                                     "Connection timed out).")
    assert (c.cls, c.side, c.rule) == ("bad_config", "unknown", "rendezvous_connect"), c
    # gpustack-6019-tcpstore-recv-zmq-port-collision: a store's peer gone names no end;
    # a socket error is never the local node's fault by its words alone.
    s = classify_failure(None, None, "[rank4]:[W810 23:02:42.934129975 TCPStore.cpp:125] "
                                     "[c10d] recvValue failed on SocketImpl(fd=102, addr=[glm-"
                                     "node01]:50360, remote=[glm-node01]:40027): Failed to "
                                     "recv, got 0 bytes. Connection was likely closed. Did the "
                                     "remote server shutdown or crash?")
    assert (s.cls, s.side) == ("network", "unknown") and not s.evicts, s


def test_the_ofi_plugin_unable_to_set_up_is_the_environment_and_mpichs_eio_the_fabric():
    # awsofinccl-1020-fi-getinfo-no-devices-in-container
    c = classify_failure(None, None, "[2025-10-16 22:16:08] ip-172-31-3-90:1929:1937 [0] "
                                     "nccl_net_ofi_rdma_init:7978 NCCL WARN NET/OFI OFI "
                                     "fi_getinfo() call failed: No data available")
    assert (c.cls, c.side, c.rule) == ("bad_config", "unknown", "ofi_setup"), c
    # awsofinccl-584-register-mr-nccl219-old-libfabric
    r = classify_failure(None, None, "register_mr_buffers:544 NCCL WARN NET/OFI Unable to "
                                     "register memory (type = 2) for device 0. RC: -22, Error: "
                                     "Invalid argument")
    assert (r.cls, r.rule) == ("bad_config", "ofi_setup"), r
    # warpx-4234-frontier-ofi-undeliverable-waitall: read as a disk fault, it evicted
    m = classify_failure(None, None, "MPIDI_OFI_handle_cq_error(1062): OFI poll failed "
                                     "(ofi_events.c:1064:MPIDI_OFI_handle_cq_error:Input/output "
                                     "error - UNDELIVERABLE)")
    assert (m.cls, m.side, m.rule) == ("network", "unknown", "ofi_provider") and not m.evicts, m


def test_cuda_failing_to_initialise_is_a_gpu_the_node_cannot_use():
    # maskrcnn-238-cuda-init-unknown-error-reboot: cleared by a reboot.
    log = ('  File "/home/u/anaconda3/envs/m/lib/python3.7/site-packages/torch/cuda/'
           '__init__.py", line 162, in _lazy_init\n'
           "    torch._C._cuda_init()\n"
           "RuntimeError: cuda runtime error (30) : unknown error at /opt/conda/conda-bld/"
           "pytorch-nightly_1542964575207/work/aten/src/THC/THCGeneral.cpp:51")
    c = classify_failure(1, None, log)
    assert (c.cls, c.side, c.rule) == ("gpu_unavailable", "unknown", "cuda_init_failed"), c
    assert not c.evicts
    # the same words from a kernel later in a run stay a CUDA error
    later = classify_failure(1, None, "RuntimeError: CUDA error: unknown error")
    assert later.cls == "cuda_error", later
    # torchpod-43-error-804-container-toolkit: forward compatibility is what the container
    # brought
    compat = classify_failure(None, None, "UserWarning: CUDA initialization: Unexpected error "
                                          "from cudaGetDeviceCount(). Error 804: forward "
                                          "compatibility was attempted on non supported HW")
    assert (compat.cls, compat.rule) == ("container_runtime", "cuda_compat_refused"), compat


def test_xla_oom_wrapped_mid_phrase_a_full_store_and_a_dataloader_bus_error():
    # jax-788-jaxlib-allocator-oom-regression: the line wraps inside "Out of memory".
    c = classify_failure(None, None, "[1] 2019-06-13 01:17:08.886805: E external/org_tensorflow"
                                     "/tensorflow/compiler/xla/python/local_client.cc:672] "
                                     "Execution of replica 0 failed: Resource exhausted: Out \n"
                                     "of memory while trying to allocate 5520758552 bytes.")
    assert c.cls == "gpu_oom", c
    # minio-10268-507-inodes-exhausted
    assert classify_failure(None, None, '"507 Insufficient Storage"').cls == "disk_full"
    # pytorch-16979-k8s-pod-dataloader-bus-error
    b = classify_failure(1, None, "RuntimeError: DataLoader worker (pid 125) is killed by "
                                  "signal: Bus error. ")
    assert (b.cls, b.rule) == ("container_runtime", "shm"), b


# Rules from the ninth batch's development misses (excerpts from those entries).

def test_ray_and_slurm_saying_a_node_is_gone_are_a_lost_node_of_unknown_side():
    # ray-43751-actor-died-node-died
    c = classify_failure(1, None, "ray.exceptions.RayActorError: The actor died unexpectedly "
                                  "before finishing this task.\n\tclass_name: RayTrainWorker\n"
                                  "The actor is dead because its node has died. Node Id: "
                                  "677df2a9020c5db45e755b0078c469e2ce51e05ea093ed3b283505a0")
    assert (c.cls, c.side, c.rule) == ("node_lost", "unknown", "ray_node_died"), c
    assert not c.evicts
    # trixie-58-srun-job-credential-expired
    t = classify_failure(None, None, "srun: error: Task launch for 36.0 failed on node cn131: "
                                     "Job credential expired")
    assert (t.cls, t.side, t.rule) == ("node_lost", "unknown", "slurm_task_launch"), t


def test_nvidia_smi_unable_to_read_a_gpu_is_a_gpu_to_diagnose():
    # gpu-operator-559-nvidia-smi-err
    log = ("|   0  ERR!                On   | 00000000:19:00.0 Off |                 ERR! |\n"
           "|ERR!  ERR! ERR!    ERR! / ERR! |      0MiB / 46068MiB |    ERR!      Default |")
    c = classify_failure(None, None, log)
    assert (c.cls, c.side, c.rule) == ("gpu_unavailable", "unknown", "nvidia_smi_err"), c


def test_nccls_info_lines_never_decide_and_its_internal_errors_are_of_unknown_side():
    # horovod-1122-nccl-shm-cuda-invalid-argument: the transport named at INFO level was
    # read as a fabric fault on the node's side
    log = ("[1,3]<stdout>:mlc-cluster-23:3070:3090 [0] NCCL INFO Ring 00 : 3 -> 0 [send] via "
           "NET/Socket/0\n[1,3]<stdout>:\n[1,3]<stdout>:mlc-cluster-23:3070:3090 [0] "
           "include/shm.h:42 NCCL WARN Cuda failure 'invalid argument'")
    c = classify_failure(None, None, log)
    assert (c.cls, c.rule) == ("cuda_error", "cuda"), c
    # nccl-833-internal-check-failed
    i = classify_failure(None, None, "ncclInternalError: Internal check failed. This is either "
                                     "a bug in NCCL or due to memory corruption")
    assert (i.cls, i.side, i.rule) == ("network", "unknown", "nccl_internal"), i
    # nemo-13996-nccl-could-not-find-net-id0
    n = classify_failure(None, None, "`graph/topo.h:230 NCCL WARN Could not find NET with id 0`")
    assert (n.cls, n.side, n.rule) == ("bad_config", "user", "nccl_net_missing"), n


def test_the_jobs_launch_environment_build_and_settings_are_its_configuration():
    # i6core-444-mpirun-rank-not-set
    c = classify_failure(1, None, "ValueError: Error initializing torch.distributed using "
                                  "env:// rendezvous: environment variable RANK expected, but "
                                  "not set")
    assert (c.cls, c.side, c.rule) == ("bad_config", "user", "launch_args"), c
    # efficientdet-241-apex-fused-optimizers-assert
    a = classify_failure(1, None, "AssertionError: APEX and CUDA required for fused optimizers")
    assert (a.cls, a.rule) == ("bad_config", "build_mismatch"), a
    # llamatuner-69-zero3-low-cpu-mem-device-map
    d = classify_failure(1, None, "ValueError: DeepSpeed Zero-3 is not compatible with "
                                  "`low_cpu_mem_usage=True` or with passing a `device_map`.")
    assert (d.cls, d.side, d.rule) == ("bad_config", "user", "incompatible_settings"), d


def test_a_spawned_child_killed_by_a_signal_is_a_signal_death_not_an_exception():
    # cliffsumm-6-fairseq-spawn-sigkill
    c = classify_failure(1, 9, "    raise ProcessExitedException(\n"
                               "torch.multiprocessing.spawn.ProcessExitedException: process 0 "
                               "terminated with signal SIGKILL")
    assert (c.cls, c.rule) == ("worker_signal", "signal"), c


# Rules from development entries the excerpt-only reviewer found decided and the rules
# missed (excerpts from those entries).

def test_nvidia_smi_finding_no_gpu_is_a_gpu_to_diagnose_not_the_jobs_setting():
    # pytorch-87890-g5-runners-gpu-vanishes
    log = ("* `RuntimeError: No CUDA GPUs are available`: https://hud.pytorch.org/failure/"
           "RuntimeError%3A%20No%20CUDA%20GPUs%20are%20available  \n"
           "* `nvidia-smi` failure `nvidia-smi --query-gpu=driver_version --format=csv,noheader "
           "--> INSTALLED_DRIVER_VERSION='No devices were found'`.  They might be related")
    c = classify_failure(1, None, log)
    assert (c.cls, c.side, c.rule) == ("gpu_unavailable", "unknown", "nvidia_smi_no_devices")
    assert not c.evicts


def test_killed_while_loading_shards_is_host_memory_a_bare_kill_is_not():
    # videollava-13-shards-killed-system-memory
    log = ("Loading checkpoint shards:   0%|          | 0/2 [00:00<?, ?it/s]Killed\n"
           "killed")
    c = classify_failure(None, 9, log)
    assert (c.cls, c.side, c.rule) == ("cpu_oom", "unknown", "killed_while_loading"), c
    bare = classify_failure(None, 9, "step 100 loss 2.1\nKilled")
    assert bare.cls == "worker_signal", bare


# Rules from the tenth batch's development misses (excerpts from those entries).

def test_tensorflow_finding_no_nvidia_driver_is_a_gpu_to_diagnose():
    # determined-3275-rank1-cuinit-no-driver
    log = ("2021-12-07 10:41:27.740947: W tensorflow/stream_executor/cuda/cuda_driver.cc:326] "
           "failed call to cuInit: UNKNOWN ERROR (303)\n"
           "2021-12-07 10:41:27.740980: I tensorflow/stream_executor/cuda/cuda_diagnostics.cc:"
           "156] kernel driver does not appear to be running on this host (exp-20): /proc/"
           "driver/nvidia/version does not exist")
    c = classify_failure(None, None, log)
    assert (c.cls, c.side, c.rule) == ("gpu_unavailable", "unknown", "gpu_driver_unreachable")


def test_a_loss_suffix_or_a_nan_std_reported_non_finite_is_a_divergence():
    # dinov2-492-koleo-loss-inf: progress lines whose running losses went inf
    log = ("I20250104 12:13:10 90 dinov2 helpers.py:102] Training  [   1270/2500000]  eta: 40 "
           "days, 13:28:36  lr: 0.0006 (0.0003)  total_loss: 6.7171 (inf)  koleo_loss: 0.0315 "
           "(inf)  time: 1.412941  data: 0.000429  max mem: 61695")
    assert classify_failure(None, None, log).cls == "nan"
    # unitree-rl-mjlab-9-ppo-std-nan-multigpu
    c = classify_failure(1, None, "RuntimeError: normal expects all elements of std >= 0.0")
    assert c.cls == "nan", c


def test_ncclsystemerror_names_no_end_and_a_bus_error_beside_shared_memory_is_its_size():
    # gptneox-419-docker-nccl-unhandled-system-error: a container's shared memory, read
    # as the fabric on the node's side before
    c = classify_failure(1, None, "5. The code crashes with a non-descript `NCCL error in: "
                                  "/pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:825, unhandled "
                                  "system error, NCCL version 2.7.8`")
    assert (c.cls, c.side, c.rule) == ("network", "unknown", "nccl_system_error"), c
    assert not c.evicts
    # llmfoundry-82-docker-bus-error-streaming
    b = classify_failure(None, 7, "Bus error (core dumped)\nroot@e81df48d8ecb:/home/llm-foundry# "
                                  "/usr/lib/python3.10/multiprocessing/resource_tracker.py:224: "
                                  "UserWarning: resource_tracker: There appear to be 2 leaked "
                                  "shared_memory objects to clean up at shutdown")
    assert (b.cls, b.rule) == ("container_runtime", "bus_error_shm"), b
    # a bus error with no shared memory in sight stays a signal death
    assert classify_failure(None, 7, "Bus error (core dumped)").cls == "worker_signal"


def test_wrapped_and_logged_exceptions_are_the_jobs_exceptions():
    # ray-14523-rllib-ppo-gpu-raytaskerror-typeerror
    c = classify_failure(1, None, "ray.exceptions.RayTaskError(TypeError): ray::PPO.train_"
                                  "buffered() (pid=18732, ip=192.168.1.100)\n"
                                  '  File "python/ray/_raylet.pyx", line 439, in ray._raylet.'
                                  "execute_task")
    assert (c.cls, c.rule) == ("user_exception", "ray_task_error"), c
    # tf-26980-distribute-strategy-summary-no-step: absl's location prefix before it
    t = classify_failure(1, None, "[ops/summary_ops_v2.py:608] ValueError: No step set via "
                                  "'step' argument or tf.summary.experimental.set_step()")
    assert (t.cls, t.side, t.rule) == ("user_exception", "user", "exception"), t
    # mxnet-13526-van-bind-failed
    m = classify_failure(1, None, "mxnet.base.MXNetError: [08:18:33] src/van.cc:291: Check "
                                  "failed: (my_node_.port) != (-1) bind failed")
    assert (m.cls, m.rule) == ("bad_config", "port"), m
