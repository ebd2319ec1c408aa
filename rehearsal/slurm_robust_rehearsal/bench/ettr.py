"""``slurm-robust bench ettr``: a long rehearsal with faults on a schedule, and its ETTR.

One robust run of examples/train_gpt.py (CPU, gloo, ``--step-time`` seconds a step) on the
mini-cluster, sized to last ``--minutes`` without faults. From its first step on, one
fault every ``--fault-every`` seconds, cycling through ``--faults`` (``slurm-robust
inject``). The figures come from the run's own records through the post-mortem analysis
(:mod:`slurm_robust.analysis`): cumulative ETTR (productive step time over wall time,
start-up included), the ETTR of the last hour (the whole run when shorter), and the
downtime split over all incidents:

- detect: fault -> detected; localise: detected -> localised;
- recover: localised -> first step after recovery (restart, restore, one step);
- redo: step time of steps finished before the fault and undone by the rollback.

Target (after ByteRobust's 97 % over three months): ETTR >= 98 % with a fault
every 5 minutes over 30 minutes; the phase-aware run (``--section``, below) >= 99 %. A
shorter run, or more frequent faults, is a rehearsal of the machinery, not a measurement
against that target (``at_target_scale``).

The phase-aware run: ``--section NAME:EVERY:SECONDS`` (the example's option, repeatable)
makes the training declare sections (``run.section``), e.g. a 5 s evaluation every 200
steps and a 3 s save every 500. A run that declares phases gets a learned hang limit per
phase (launcher/control/phases.py): the steady steps max(3 s, 5 x p95 step) instead of the
single rule's floor (``--hang-timeout``), which is what a stopped worker costs. Section
time counts as productive (it lies inside the next step's interval, as evaluation and
saves are the job's own work); the report gives the run's learned limits and the limit
each hang incident was declared under.

``--arm both`` runs the robust run and its torchrun + DCP peer at once on the same
cluster (each gets the schedule from its own first step): the two see the same machine
load, which two separate runs on this shared machine do not. The peer is submitted once
the robust run recorded its first step, so that neither start-up pays for the other's
torch imports on the two cores that host both (on a cluster each job's nodes have CPUs
of their own); from then on they run side by side. It needs nodes for both
(``cluster up --nodes 6``: 3 for the robust run with its spare, 2 for the peer, 1 for the
peer's requeue after its kill-node).
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust_rehearsal.bench.arms import EttrArm, EttrRun, ettr_arms, subject
from slurm_robust_rehearsal.bench.ettr_common import (
    FAULTS,
    LONG_RUN_LR,
    TARGET_ETTR,
    TARGET_ETTR_PHASES,
    TARGET_FAULT_EVERY_S,
    TARGET_MINUTES,
    downtime_split,
    parse_faults,
    parse_sections,
    phase_figures,
    planned_steps,
    schedule,
    section_args,
    section_s_per_step,
)

__all__ = ["BOTH", "FAULTS", "HELP", "LONG_RUN_LR", "TARGET_ETTR", "TARGET_ETTR_PHASES",
           "TARGET_FAULT_EVERY_S", "TARGET_MINUTES", "add_arguments", "downtime_split",
           "parse_faults", "parse_sections", "phase_figures", "planned_steps", "run",
           "schedule", "section_args", "section_s_per_step"]

HELP = "long rehearsal with faults on a schedule: cumulative and 1-hour ETTR, downtime split"
#: What the robust run's report says of a peer (its ``--arm`` word in ``{name}``).
PEER_NOTE = ("a separate run of the same length: slurm-robust bench ettr --arm {name} "
             "with the same options (sbatch --requeue + torchrun --max-restarts + DCP "
             "async_save; bench/ettr_torchrun.py)")
#: ``--arm``: every arm at once.
BOTH = "both"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=30.0,
                        help="length of the fault-free run (default 30)")
    parser.add_argument("--fault-every", type=float, default=300.0, metavar="S",
                        help="seconds between faults (default 300)")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"comma-separated, used in turn (default {','.join(FAULTS)})")
    parser.add_argument("--nodes", type=int, default=2, help="worker nodes (default 2)")
    parser.add_argument("--spares", type=int, default=1, help="spare nodes (default 1)")
    parser.add_argument("--step-time", type=float, default=0.5,
                        help="seconds a step takes (default 0.5)")
    parser.add_argument("--hang-timeout", type=float, default=15.0,
                        help="hang floor for stop-worker (default 15 s)")
    parser.add_argument("--section", action="append", default=[],
                        metavar="NAME:EVERY:SECONDS",
                        help="the phase-aware run: after every EVERY-th step the training "
                             "spends SECONDS in run.section(NAME) (repeatable; e.g. "
                             "eval:200:5 and save:500:3); both arms run them")
    names = [arm.name for arm in ettr_arms()]
    parser.add_argument("--arm", choices=(*names, BOTH), default=subject().name,
                        help=f"{names[0]}: slurm_robust (default); "
                             f"{', '.join(names[1:])}: the same schedule "
                             "on sbatch --requeue + torchrun --max-restarts + DCP "
                             f"(bench/ettr_torchrun.py); {BOTH}: the two at once on one "
                             "cluster (cluster up --nodes 6)")


def run(args: argparse.Namespace) -> dict[str, Any]:

    faults = parse_faults(args.faults)
    parse_sections(args.section)
    if args.minutes <= 0 or args.fault_every <= 0 or args.step_time <= 0:
        raise UsageError("--minutes, --fault-every and --step-time must be positive")
    if args.arm == BOTH:
        return _both(args, faults)
    return next(arm for arm in ettr_arms() if arm.name == args.arm).ettr(_one(args, faults))


def _one(args: argparse.Namespace, faults: list[str],
         first_step: threading.Event | None = None) -> EttrRun:
    """What each arm's run gets; the subject's report names its peers."""
    peers = {arm.label: PEER_NOTE.format(name=arm.name) for arm in ettr_arms()
             if not arm.subject}
    return EttrRun(args=args, faults=faults, peers=peers, first_step=first_step)


def _both(args: argparse.Namespace, faults: list[str]) -> dict[str, Any]:
    """The two arms side by side, each in its own thread, the peers submitted once the
    subject's run recorded its first step (or ended without one); an arm that fails says
    why."""
    out: dict[str, Any] = {}
    first_step = threading.Event()

    def one(arm: EttrArm, started: threading.Event | None) -> None:
        try:
            out[arm.name] = arm.ettr(_one(args, faults, started))
        except Exception as exc:  # noqa: BLE001 - reported as the arm's result
            out[arm.name] = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            if started is not None:
                started.set()  # an arm that failed before its first step frees the peers

    arms = ettr_arms()
    threads = {arm.name: threading.Thread(
        target=one, args=(arm, first_step if arm.subject else None), daemon=True)
        for arm in arms}
    threads[subject().name].start()
    first_step.wait()
    for name, t in threads.items():
        if name != subject().name:
            t.start()
    for t in threads.values():
        t.join()
    out = {arm.name: out[arm.name] for arm in arms}  # the registry's order
    robust = out[subject().name]
    return {"benchmark": "ettr", "arm": BOTH, "arms": out,
            "target": robust.get("target", {}),
            "note": "the two arms ran side by side on one cluster, the peer submitted once "
                    "the robust run recorded its first step, each faulted on the same "
                    "schedule from its own first step"}
