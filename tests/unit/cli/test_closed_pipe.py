"""A reader that closes the pipe early (``slurm-robust status ... | head -1``) ends the
CLI quietly with 141 (128 + SIGPIPE, as a shell reports it), never with a traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# The real entry point with one subcommand's body swapped for a long printout (a status
# of a run with many incidents is the real case): what is under test is main's handling.
FLOOD = textwrap.dedent("""
    import sys
    from slurm_robust.cli import main
    from slurm_robust_rehearsal.cluster import cli as cluster

    def flood(args):
        for i in range(200_000):
            print("line", i)
        return 0

    cluster.run = flood
    sys.exit(main.main(["cluster", "status"]))
""")


def test_a_closed_pipe_ends_the_cli_without_a_traceback():
    proc = subprocess.Popen([sys.executable, "-c", FLOOD], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"line 0")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
