"""The break-fix loop: a drained node returns to service without an admin, or goes to one.

A node waiting drained "pending deep check" (a job's verdict, a node found down under a
job, an admin's ``node resume``) is judged on the node by slurmd's HealthCheckProgram
(slurm_robust.node_deep_check). The site's ``repair`` section makes that judgement a loop
of rounds::

    deep check --(reboot: always, or on_failure and it failed)--> reboot --> re-validate
        |                                                                     |
        passed: resume                                  passed: resume, failed: round over
        failed (no reboot): round over

A round that is over starts the next one at the next HealthCheckInterval; after
``rounds`` of them the node is drained ``slurm_robust: deep check failed: <check>: ...
(N repair rounds)``, which nothing resumes: it is a human's, with every round in the node
ledger (``slurm-robust node history``) and in the node's ``repair.json``.

- ``rounds`` (default 1): one deep check, then a human: the loop without a reboot is
  what the deep check did before the loop existed. A node pending because someone asked
  for a check (an admin's ``node resume``, the reserve's stale deep pass) gets that one
  check, never a loop or a reboot (:func:`is_request`).
- ``reboot``: ``never`` (default; a site turns reboots on knowingly), ``on_failure``
  (only a node that failed its deep check: a GPU that needs a reset, a leaked mount),
  ``always`` (every round: some sites reboot every node that a job blamed).
- ``reboot_command``: argv with ``{node}`` and ``{reason}`` replaced; default
  ``scontrol reboot reason={reason} {node}``. Not ``nextstate=RESUME``: that would put
  the node back in service before it is re-validated; without a next state it comes back
  drained with our reason, and the re-validation resumes it. The mini-cluster's command
  restarts the node's slurmd (``slurm-robust cluster reboot``): a reboot as Slurm sees one.
- ``reboot_timeout_s`` (default 1800): a reboot not seen by then ends the round.

The node is back from its reboot when its boot identity changed: the kernel's boot id
with the pid and start time of the slurmd that runs this program (the mini-cluster's
nodes share one kernel; a slurmd restart is their reboot). The loop's state lives in
``<state_dir>/repair.json`` (root-only, atomic) so that a reboot does not lose it; the
node's Slurm reason says where it is (``... pending deep check: repair 2/3 ...``).

Deciding is pure (:func:`after_suite`, :func:`before_suite`); node_deep_check acts.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.health.drain import DEEP_FAILED_PREFIX, PENDING_PREFIX
from slurm_robust.records import read_json_bounded, write_json_atomic
from slurm_robust.stacks.procfs import read_stat

REPAIR_FILE = "repair.json"
REPAIR_SCHEMA = "slurm_robust.repair"
REPAIR_VERSION = 1
#: Rounds kept in the file's history (the ledger keeps them all).
KEEP_HISTORY = 32
MAX_FILE_BYTES = 256 << 10
DEFAULT_REBOOT_COMMAND = ("scontrol", "reboot", "reason={reason}", "{node}")
#: The pending reasons that ask for a check rather than report a failure: an admin's
#: ``node resume`` and the reserve's stale deep pass. Each gets one deep check and no
#: reboot: the caller waits for the answer (minutes, not a reboot's), and a spare whose
#: pass went stale has done nothing wrong.
RESUME_REQUEST = "resume requested by"
RESERVE_REQUEST = "reserve: deep pass stale"


class RebootPolicy(StrEnum):
    NEVER = "never"
    ON_FAILURE = "on_failure"
    ALWAYS = "always"


class RepairPhase(StrEnum):
    """Where a node is in the loop. CHECK: its next deep check is due. REBOOTING: a
    reboot was issued; the next run after it re-validates. HUMAN: the last round failed;
    the node waits for a person (the record is kept for them)."""

    CHECK = "check"
    REBOOTING = "rebooting"
    HUMAN = "human"


class RepairStep(StrEnum):
    """What to do now: resume it, reboot it, start the next round, hand it to a human,
    or wait (a reboot is under way)."""

    RESUME = "resume"
    REBOOT = "reboot"
    NEXT_ROUND = "next_round"
    HUMAN = "human"
    WAIT = "wait"


@dataclass(frozen=True)
class RepairConfig:
    rounds: int = 1
    reboot: RebootPolicy = RebootPolicy.NEVER
    reboot_command: tuple[str, ...] = DEFAULT_REBOOT_COMMAND
    reboot_timeout_s: float = 1800.0


VALID_KEYS = ("rounds (int >= 1), reboot (never|on_failure|always), reboot_command "
              "(argv list with {node} and {reason}), reboot_timeout_s (seconds > 0)")


def repair_config(raw: Any) -> RepairConfig:
    """The site config's ``repair`` object, validated (UsageError names the bad key)."""
    if raw is None or raw == {}:
        return RepairConfig()
    if not isinstance(raw, dict):
        raise UsageError(f"site config repair={raw!r} must be an object")
    unknown = sorted(set(raw) - {"rounds", "reboot", "reboot_command", "reboot_timeout_s"})
    if unknown:
        raise UsageError(f"site config repair: unknown key(s) {unknown}; valid: {VALID_KEYS}")
    rounds = raw.get("rounds", 1)
    if type(rounds) is not int or rounds < 1:
        raise UsageError(f"site config repair.rounds={rounds!r} must be an integer >= 1")
    try:
        reboot = RebootPolicy(raw.get("reboot", "never"))
    except ValueError:
        raise UsageError(f"site config repair.reboot={raw.get('reboot')!r} must be one of "
                         f"{', '.join(p.value for p in RebootPolicy)}") from None
    command = raw.get("reboot_command", list(DEFAULT_REBOOT_COMMAND))
    if not isinstance(command, list) or not command or \
            not all(isinstance(a, str) and a for a in command) or \
            not any("{node}" in a for a in command):
        raise UsageError(f"site config repair.reboot_command={command!r} must be a list of "
                         "non-empty strings naming the node as {node}")
    timeout = raw.get("reboot_timeout_s", 1800.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise UsageError(f"site config repair.reboot_timeout_s={timeout!r} must be seconds > 0")
    return RepairConfig(rounds, reboot, tuple(command), float(timeout))


@dataclass
class RepairRecord:
    """One node's place in the loop (``repair.json``). ``round`` counts from 1; ``boot``:
    the boot identity when the reboot was issued; ``cause``: the reason the node entered
    the loop with; ``history``: one entry per deep check,
    reboot and re-validation of the loop, newest last."""

    node: str
    round: int = 1
    phase: RepairPhase = RepairPhase.CHECK
    boot: str = ""
    since: float = 0.0
    cause: str = ""
    #: The drain reason the loop set last: a node found with another one was put back
    #: in the loop by someone else (a new blame, an admin's resume) and starts afresh.
    reason: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)

    def note(self, step: str, passed: bool | None, detail: str, now: float) -> None:
        self.history.append({"time": round(now, 3), "round": self.round, "step": step,
                             "passed": passed, "detail": detail})
        del self.history[:-KEEP_HISTORY]

    def to_json(self) -> dict[str, Any]:
        return {"schema": REPAIR_SCHEMA, "v": REPAIR_VERSION,
                **{k: (v.value if isinstance(v, StrEnum) else v)
                   for k, v in asdict(self).items()}}


def is_request(cause: str) -> bool:
    """``cause`` (a pending reason without its prefix) asks for one check."""
    return cause.startswith((RESUME_REQUEST, RESERVE_REQUEST))


def repair_path(state_dir: Path) -> Path:
    return state_dir / REPAIR_FILE


def load_record(state_dir: Path, node: str) -> RepairRecord | None:
    """The node's record, or None when it is in no loop. A record that cannot be read
    (torn, another version, another node's) starts the loop afresh rather than block it."""
    try:
        raw = read_json_bounded(repair_path(state_dir), MAX_FILE_BYTES)
    except (OSError, ValueError):  # missing, unreadable, too large, not JSON
        return None
    if not isinstance(raw, dict) or raw.get("schema") != REPAIR_SCHEMA or \
            raw.get("v") != REPAIR_VERSION or raw.get("node") != node:
        return None
    try:
        return RepairRecord(node=node, round=int(raw["round"]),
                            phase=RepairPhase(raw["phase"]), boot=str(raw.get("boot", "")),
                            since=float(raw.get("since", 0.0)),
                            cause=str(raw.get("cause", "")),
                            reason=str(raw.get("reason", "")),
                            history=[h for h in raw.get("history", []) if isinstance(h, dict)])
    except (KeyError, TypeError, ValueError):
        return None


def save_record(state_dir: Path, record: RepairRecord) -> None:
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_json_atomic(repair_path(state_dir), record.to_json(), mode=0o600)


def clear_record(state_dir: Path) -> None:
    try:
        repair_path(state_dir).unlink()
    except FileNotFoundError:
        pass


def before_suite(record: RepairRecord, boot: str, cfg: RepairConfig,
                 now: float) -> RepairStep | None:
    """Before running the suite: WAIT while an issued reboot has not happened (the boot
    identity is the one it was issued under), NEXT_ROUND or HUMAN when it never came;
    None: run the suite."""
    if record.phase is not RepairPhase.REBOOTING or boot != record.boot:
        return None
    if now - record.since < cfg.reboot_timeout_s:
        return RepairStep.WAIT
    return round_over(record, cfg)


def after_suite(record: RepairRecord, passed: bool, cfg: RepairConfig) -> RepairStep:
    """What the suite's result leads to (the module docstring's loop)."""
    if record.phase is RepairPhase.REBOOTING:  # this run was the re-validation
        return RepairStep.RESUME if passed else round_over(record, cfg)
    if cfg.reboot is RebootPolicy.ALWAYS or (cfg.reboot is RebootPolicy.ON_FAILURE
                                             and not passed):
        return RepairStep.REBOOT
    return RepairStep.RESUME if passed else round_over(record, cfg)


def round_over(record: RepairRecord, cfg: RepairConfig) -> RepairStep:
    """A failed round: the next one, or a human after the last."""
    return RepairStep.NEXT_ROUND if record.round < cfg.rounds else RepairStep.HUMAN


def reboot_argv(cfg: RepairConfig, node: str, reason: str) -> list[str]:
    return [a.replace("{node}", node).replace("{reason}", reason) for a in cfg.reboot_command]


def boot_identity(pid: int | None = None, proc: Path = Path("/proc")) -> str:
    """The kernel's boot id and the pid:start time of the nearest slurmd above ``pid``
    (default: this process's parent). Changes with a real reboot and with a restart of
    the node's slurmd (the mini-cluster's reboot)."""
    try:
        boot_id = (proc / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot_id = "?"
    current = os.getppid() if pid is None else pid
    for _ in range(16):
        if current <= 1:
            break
        stat = read_stat(current, proc)  # any user's process may name itself oddly
        if stat is None or len(stat[1]) < 20:
            break
        comm, fields = stat
        if comm == "slurmd":
            return f"{boot_id}:slurmd:{current}:{fields[19]}"
        current = int(fields[1])
    return f"{boot_id}:no-slurmd"


_IN_LOOP = re.compile(re.escape(PENDING_PREFIX) + r" repair (\d+)/(\d+)( rebooting)?(:|$)")
_HANDED_OVER = re.compile(r"\((\d+) repair rounds\)$")


def loop_state(reason: str) -> dict[str, Any] | None:
    """Where a node is in the loop, read from its Slurm drain reason (what the loop
    writes there): ``{phase, round, rounds}``, ``rounds`` None where the reason does not
    say; None for a node in no loop. Needs no file on the node (``node status`` and the
    exporter read every node's reason from one Slurm call)."""
    text = (reason or "").strip()
    m = _IN_LOOP.match(text)
    if m:
        return {"phase": (RepairPhase.REBOOTING if m.group(3) else RepairPhase.CHECK).value,
                "round": int(m.group(1)), "rounds": int(m.group(2))}
    if text.startswith(PENDING_PREFIX):
        return {"phase": RepairPhase.CHECK.value, "round": 1, "rounds": None}
    if text.startswith(DEEP_FAILED_PREFIX):
        h = _HANDED_OVER.search(text)
        n = int(h.group(1)) if h else 1
        return {"phase": RepairPhase.HUMAN.value, "round": n, "rounds": n}
    return None
