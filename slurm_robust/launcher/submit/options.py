"""Command-line options shared by ``slurm-robust submit`` and ``slurm-robust launch``.

Precedence: RunConfig defaults < environment (``SLURM_ROBUST_SPARES``,
``SLURM_ROBUST_HANG_TIMEOUT``, ``SLURM_ROBUST_MAX_RESTARTS``, exported by the SPANK
plugin) < command line.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.launcher.config import RunConfig, env_defaults
from slurm_robust.launcher.control.phases import parse_overrides
from slurm_robust.scriptenv import interpreter_warning

_D = RunConfig  # its class attributes are the defaults the help texts show
_TIME = re.compile(r"^(?:(?P<d>\d+)-)?(?P<h>\d+):(?P<m>\d+)(?::(?P<s>\d+))?$")


def add_robust_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--warn-before", type=float, default=None, metavar="SECONDS",
                   help="requeue the job with its newest step this long before its time "
                        "limit: on Slurm's warning (submit asks for --signal=28@SECONDS, "
                        "SIGWINCH) or by the job's end time, read from Slurm once a minute "
                        "(default 60)")
    p.add_argument("--spares", type=int, default=None,
                   help="parked spare nodes in the allocation (default: $SLURM_ROBUST_SPARES "
                        "or 0)")
    p.add_argument("--folder", default=None, metavar="RUN_DIR",
                   help="run directory on a shared filesystem (default: runs/<time>)")
    p.add_argument("--workers-per-node", "--nproc-per-node", dest="workers_per_node",
                   type=int, default=None, metavar="N",
                   help="ranks per node, like torchrun's --nproc-per-node (default: "
                        "--gpus-per-node, else 1)")
    p.add_argument("--resume-args", default=None, metavar="ARGS",
                   help="arguments appended to the command from the first restart on, for "
                        "a script with its own checkpoints (e.g. '--init_from=resume')")
    p.add_argument("--resume-if-exists", default=None, metavar="FILE",
                   help="append --resume-args only when FILE exists (relative to the "
                        "working directory), e.g. out/ckpt.pt")
    p.add_argument("--auto-steps", action="store_true",
                   help="report a step per optimizer.step() of an unmodified Python "
                        "script (hang detection, progress, ETTR; see docs/USER_GUIDE.md)")
    p.add_argument("--hang-timeout", type=float, default=None, metavar="S",
                   help="hang floor in seconds (hang = no step for max(S, factor x median); "
                        f"default {_D.hang_floor_s:g})")
    p.add_argument("--hang-factor", type=float, default=None, metavar="M",
                   help=f"the factor of --hang-timeout (default {_D.hang_factor:g})")
    p.add_argument("--hang-limit", action="append", default=None, metavar="PHASE=S",
                   help="a fixed hang limit for one phase, replacing the learned one "
                        "(repeatable; PHASE: startup, steps, eval, save, section, "
                        "section:NAME, finishing; see docs/USER_GUIDE.md)")
    p.add_argument("--startup-timeout", type=float, default=None, metavar="S",
                   help="longest wait for the first step of a (re)started worker group, "
                        "for scripts that report steps (default 1800); a script that never "
                        "reports a step is never declared hung")
    p.add_argument("--max-restarts", type=int, default=None, metavar="N",
                   help="restart budget, in-job restarts and Slurm requeues together "
                        f"(default {_D.max_restarts}; $SLURM_ROBUST_MAX_RESTARTS)")
    p.add_argument("--outage-budget", type=float, default=None, metavar="S",
                   help="how long an external service (model hub, object store) may be "
                        "down at start-up before the run stops naming it; such start-up "
                        "failures are retried after a backoff and do not count against "
                        f"the restart or no-progress budgets (default {_D.outage_budget_s:g})")
    p.add_argument("--outage-backoff", type=float, default=None, metavar="S",
                   help="the first wait before restarting after such a failure, doubling "
                        f"each time (default {_D.outage_backoff_s:g})")
    p.add_argument("--outage-backoff-max", type=float, default=None, metavar="S",
                   help=f"the longest such wait (default {_D.outage_backoff_max_s:g})")
    p.add_argument("--local-every", type=int, default=None, metavar="STEPS",
                   help="checkpoint to node-local disk every STEPS steps (default "
                        f"{_D.local_every}; 0: never); memory and peer copies are every step")
    p.add_argument("--durable-every", type=int, default=None, metavar="STEPS",
                   help="checkpoint to the run directory every STEPS steps (default "
                        f"{_D.durable_every}; 0: never)")
    p.add_argument("--heartbeat-timeout", type=float, default=None, metavar="S",
                   help="an agent silent this long is lost and its node blamed (default "
                        f"{_D.heartbeat_timeout_s:g}; at least five heartbeats, which grow "
                        "past 200 nodes: docs/ARCHITECTURE.md)")
    p.add_argument("--fail-slow-interval", type=float, default=None, metavar="S",
                   help="fail-slow detection: seconds per round (default 10; a node "
                        "flagged slowest in 3 of 5 rounds is evicted)")
    p.add_argument("--fail-slow-factor", type=float, default=None, metavar="F",
                   help="fail-slow detection: a rank is slow above F x the median busy "
                        "time (default 1.5)")
    p.add_argument("--fail-slow-min-excess", type=float, default=None, metavar="S",
                   help="fail-slow detection: and at least S seconds above it (default "
                        f"{_D.fail_slow_min_excess_s:g}; ignores jitter on short steps)")
    p.add_argument("--no-fail-slow", action="store_true",
                   help="turn fail-slow detection off")
    p.add_argument("--nan-policy", choices=("stop", "skip"), default=None,
                   help="a NaN that returns at the same step and rank after a replay is the "
                        "data or the model: stop with a verdict (default) or skip that batch")
    p.add_argument("--on-shortfall", choices=("shrink", "stop", "wait"), default=None,
                   help="a requeue the partition and reserve cannot serve (too few nodes "
                        "off the blamed ones): shrink (the default) = requeue with fewer "
                        "spares if the world fits, else stop; stop = stop with a verdict; "
                        "wait = pend until nodes return")
    p.add_argument("--drain", action="store_true",
                   help="also drain blamed nodes directly (Slurm operators only)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- followed by the training command")


def build_config(args: argparse.Namespace, nodes: int, gpus_per_node: int | None) -> RunConfig:
    """A RunConfig from parsed options (env defaults below explicit flags)."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    # open-ended: RunConfig keyword arguments from the user's flags and environment
    values: dict[str, Any] = {**env_defaults()}
    for flag, key in (("spares", "spares"), ("hang_timeout", "hang_floor_s"),
                      ("hang_factor", "hang_factor"), ("max_restarts", "max_restarts"),
                      ("startup_timeout", "startup_timeout_s"),
                      ("outage_budget", "outage_budget_s"),
                      ("outage_backoff", "outage_backoff_s"),
                      ("outage_backoff_max", "outage_backoff_max_s"),
                      ("local_every", "local_every"), ("durable_every", "durable_every"),
                      ("heartbeat_timeout", "heartbeat_timeout_s"),
                      ("fail_slow_interval", "fail_slow_interval_s"),
                      ("fail_slow_factor", "fail_slow_factor"),
                      ("fail_slow_min_excess", "fail_slow_min_excess_s"),
                      ("workers_per_node", "workers_per_node"),
                      ("nan_policy", "nan_policy"),
                      ("on_shortfall", "on_shortfall"),
                      ("warn_before", "warn_before_s")):
        value = getattr(args, flag)
        if value is not None:
            values[key] = value
    values.setdefault("workers_per_node", gpus_per_node or 1)
    if getattr(args, "hang_limit", None):
        try:
            values["hang_limits"] = parse_overrides(args.hang_limit)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if getattr(args, "resume_args", None):
        values["resume_args"] = tuple(shlex.split(args.resume_args))
    if getattr(args, "resume_if_exists", None):
        values["resume_if_exists"] = args.resume_if_exists
    run_dir = args.folder or str(Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    cfg = RunConfig(command=tuple(command), run_dir=run_dir, nodes=nodes,
                    drain=bool(args.drain), auto_steps=bool(getattr(args, "auto_steps", False)),
                    fail_slow=not getattr(args, "no_fail_slow", False), **values)
    warning = interpreter_warning(cfg.command)
    if warning:
        print(f"slurm-robust: warning: {warning}", file=sys.stderr)
    return cfg


def parse_time_minutes(text: str) -> int:
    """Slurm-style time: minutes, ``HH:MM[:SS]`` or ``D-HH:MM[:SS]``; rounded up."""
    if text.isdigit():
        return int(text)
    m = _TIME.match(text)
    if not m:
        raise UsageError(f"--time {text!r}: use minutes, HH:MM[:SS] or D-HH:MM[:SS]")
    seconds = (int(m["d"] or 0) * 86400 + int(m["h"]) * 3600 + int(m["m"]) * 60
               + int(m["s"] or 0))
    return max(1, -(-seconds // 60))
