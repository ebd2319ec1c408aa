"""Retries, timeouts and error messages of the one Slurm command runner (real processes)."""

import os
import stat
from pathlib import Path

import pytest

from slurm_robust.slurm.runner import (
    RetryPolicy,
    SlurmCommandError,
    SlurmNotInstalledError,
    run_slurm_command,
)


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake_scontrol"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_transient_failure_is_retried_then_succeeds(tmp_path):
    counter = tmp_path / "count"
    prog = _script(tmp_path, f"""
n=$(cat {counter} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {counter}
if [ $n -lt 3 ]; then
  echo "scontrol: error: Socket timed out on send/recv operation" >&2; exit 1
fi
echo ok
""")
    delays = []
    proc = run_slurm_command([prog], policy=RetryPolicy(attempts=4, delay_s=0.1),
                             sleep=delays.append)
    assert proc.stdout.strip() == "ok"
    assert delays == [0.1, 0.2]  # exponential backoff between the three attempts


def test_permanent_failure_is_not_retried_and_names_command_and_message(tmp_path):
    counter = tmp_path / "count"
    prog = _script(tmp_path, f"""
echo x >> {counter}
echo "scontrol: error: Invalid job id specified" >&2; exit 1
""")
    with pytest.raises(SlurmCommandError) as info:
        run_slurm_command([prog, "requeue", "999"], sleep=lambda s: None)
    msg = str(info.value)
    assert "requeue 999" in msg and "exited 1" in msg and "Invalid job id specified" in msg
    assert len(counter.read_text().split()) == 1


def test_timeout_is_reported_after_all_attempts(tmp_path):
    prog = _script(tmp_path, "sleep 5\n")
    with pytest.raises(SlurmCommandError) as info:
        run_slurm_command([prog], policy=RetryPolicy(attempts=2, timeout_s=0.3, delay_s=0),
                          sleep=lambda s: None)
    assert info.value.timed_out and "timed out after 2 attempts" in str(info.value)


def test_missing_program_says_what_to_install():
    with pytest.raises(SlurmNotInstalledError, match="slurm-client"):
        run_slurm_command(["definitely-not-a-slurm-command-xyz"])


def test_arguments_are_never_interpreted_by_a_shell(tmp_path):
    prog = _script(tmp_path, 'printf "%s\\n" "$@"\n')
    hostile = "node1; touch " + os.fspath(tmp_path / "pwned")
    out = run_slurm_command([prog, hostile]).stdout
    assert out.strip() == hostile and not (tmp_path / "pwned").exists()
