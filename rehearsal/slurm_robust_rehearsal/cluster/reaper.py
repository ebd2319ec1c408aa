"""Run a command as the child of a subreaper that reaps orphans at once.

Usage: ``python reaper.py COMMAND [ARG...]`` (the mini-cluster starts each slurmd so).

Why: with ``ProctrackType=proctrack/pgid`` a job step is over when no process of its
process group is left, and a zombie still counts. srun leaves an orphaned helper that
dies with it; its zombie waits for whoever adopts it. Here that is the container's init,
which reaps every 2 s, so slurmstepd polled on (1 s, then 2 s) and every batch job with
an srun ended 3 s late. Under a subreaper (``PR_SET_CHILD_SUBREAPER``) orphans of the
node's processes (slurmstepd itself, after slurmd's double fork, and what its jobs
leave) are adopted by this process, which reaps them as soon as they die; on a real
node systemd plays this part.

Signals this process gets (``cluster down``'s SIGTERM, a reboot's) go to the command;
the command gets SIGKILL when this process dies (``PR_SET_PDEATHSIG``), so killing the
pid in the daemon's pid file still kills the node's slurmd (``inject kill-node``). The
exit status is the command's. Standard library only, no package imports: it runs under
whichever interpreter the cluster uses, before anything else on the node.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: dash's PATH when none is set (and Debian's /etc/profile's for root).
SHELL_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
             signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT)


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")


def exit_status(status: int) -> int:
    """A shell's exit status for a ``waitpid`` status (128 + signal when killed)."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: reaper.py COMMAND [ARG...]", file=sys.stderr)
        return 2
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    parent = os.getpid()
    # Held from before the fork until the handlers know the child: a signal that comes
    # in between is delivered then, not lost (or fatal to the reaper alone).
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    child = os.fork()
    if child == 0:
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)  # exec keeps a mask
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # the reaper died before the prctl took hold
                os._exit(1)
            # Started with no PATH at all (the break-fix loop runs its reboot command in a
            # clean environment), look where a shell would: Python's own default lacks
            # the sbin directories, where slurmd is.
            env = dict(os.environ)
            env.setdefault("PATH", SHELL_DEFAULT_PATH)
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            print(f"reaper: cannot run {argv[0]}: {exc}", file=sys.stderr, flush=True)
        os._exit(127)

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # nothing left at all (cannot happen before the child)
            return 1
        if pid == child:
            return exit_status(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
