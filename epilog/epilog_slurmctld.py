#!/usr/bin/env python3
"""EpilogSlurmctld: apply a job's verdicts, hand it spares (runs as SlurmUser, every job end).

Slurm runs this on the controller after every job, including on requeue, with
SLURM_JOB_ID, SLURM_JOB_USER, SLURM_JOB_UID, SLURM_JOB_NODELIST, SLURM_JOB_PARTITION and
SLURM_JOB_RESTART_COUNT set. A job that left no verdict file costs one failed ``open``.
It always exits 0: a failure here must not hold up the job's end; errors are logged to
the verdict log instead (see slurm_robust.reserve.handoff).
"""

from __future__ import annotations

import os
import sys
import time
import traceback

EXIT_OK = 0
# How long the detached child waits for a requeued job to leave COMPLETING.
START_WAIT_S = 120.0


def main() -> int:
    # No earlier than the kill that revoked the job's credential (slurm/restart.py).
    started = time.time()
    try:
        from slurm_robust.reserve.handoff import handle_job_end, job_end_from_env
        from slurm_robust.site_config import load_site_config

        site = load_site_config()
        end = job_end_from_env(os.environ)
        report = handle_job_end(end, site, _slurm_factory(site), _gate(site))
        # Every requeued job with verdicts, spares handed over or not: otherwise Slurm's
        # BeginTime (cred_expire, 120 s by default) holds it even when nodes are free.
        if report is not None and report.requeued:
            _start_detached(site, end.job_id, started, report.stop_reason)
    except Exception as exc:  # noqa: BLE001 - logged, never raised into slurmctld
        _log_error(exc)
    return EXIT_OK


def _start_detached(site, job_id: str, requeued_at: float,
                    stop_reason: str | None = None) -> None:
    """Fork a session-less child that resets the job's StartTime once it is PENDING (or,
    with ``stop_reason``, stops it with that verdict: it cannot be placed any more).

    Detached because Slurm sets the requeued job's BeginTime only when it finishes
    completing, which may wait for this script; the child is bounded by a timeout.
    """
    if os.fork() != 0:
        return
    try:
        os.setsid()
        if os.fork() != 0:
            os._exit(EXIT_OK)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        from slurm_robust.records import append_records, make_record
        from slurm_robust.reserve.config import SHARED_FILE_MODE, reserve_config
        from slurm_robust.reserve.handoff import start_when_requeued
        from slurm_robust.reserve.respare import stop_when_requeued
        from slurm_robust.slurm.restart import STARTED

        cfg = reserve_config(site)
        if stop_reason:
            what = stop_when_requeued(_slurm_factory(site)(), job_id, stop_reason,
                                      START_WAIT_S, time.monotonic, time.sleep)
            action, ok = "stop", what == "stopped with a verdict"
        else:
            what = start_when_requeued(_slurm_factory(site)(), job_id, START_WAIT_S,
                                       requeued_at)
            action, ok = "start_now", what == STARTED
        append_records(cfg.log_file, [make_record("slurm_robust.reserve_action", 1, {
            "op": "handoff", "action": action, "node": None, "job_id": job_id,
            "ok": ok, "why": stop_reason or what, "error": "" if ok else what,
            "dry_run": False})], mode=SHARED_FILE_MODE)
    except Exception as exc:  # noqa: BLE001 - a detached child has only the log
        _log_error(exc)
    finally:
        os._exit(EXIT_OK)


def _slurm_factory(site):
    # Called only when the job left verdicts: the common path imports no Slurm code.
    def make():
        from slurm_robust.reserve.config import reserve_config
        from slurm_robust.slurm import RetryPolicy, Slurm

        timeout = reserve_config(site).call_timeout_s
        return Slurm(policy=RetryPolicy(attempts=2, timeout_s=timeout))
    return make


def _gate(site):
    from slurm_robust.reserve.gate import LocalSuiteGate

    return lambda slurm: LocalSuiteGate(site, slurm.node_address)


def _log_error(exc: BaseException) -> None:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    print(f"slurm_robust: epilog_slurmctld: {text}", file=sys.stderr)
    try:
        from slurm_robust.records import append_records, make_record
        from slurm_robust.reserve.config import SHARED_FILE_MODE
        from slurm_robust.site_config import load_site_config

        append_records(load_site_config().verdict_log, [make_record(
            "slurm_robust.verdict_action", 1,
            {"job_id": os.environ.get("SLURM_JOB_ID", ""), "action": "error", "why": text,
             "traceback": traceback.format_exc()[-2000:]}, now=time.time())],
            mode=SHARED_FILE_MODE)
    except Exception:  # noqa: BLE001 - nowhere left to report to but stderr
        traceback.print_exc()


if __name__ == "__main__":
    sys.exit(main())
