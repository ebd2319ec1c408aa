"""The Slurm access layer: every call the project makes to Slurm goes through ``Slurm``.

Backend: Slurm's own commands (sbatch, scontrol, sinfo, squeue, sacct, sacctmgr), which
work on every Slurm from 22.05 on; JSON output is parsed where 22.05 offers it
(``sinfo --json``, ``squeue --json``), ``--parsable2`` elsewhere. pyslurm is not used:
PyPI carries only pyslurm 25.11, which refuses to build against Debian 12's Slurm 22.05
("Slurm version mismatch"); :func:`pyslurm_status` says whether an installed pyslurm
would match the running Slurm.

Every call has a timeout and retries transient failures (see ``runner.py``); a failure
raises :class:`SlurmCommandError` naming the command and what Slurm said.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from slurm_robust.errors import UsageError
from slurm_robust.slurm.hostlist import expand_hostlist
from slurm_robust.slurm.records import (
    SACCT_FIELDS,
    AcctJob,
    Job,
    Node,
    SlurmParseError,
    parse_sacct_parsable,
    parse_scontrol_oneliner,
    parse_sinfo_json,
    parse_squeue_json,
)
from slurm_robust.slurm.restart import start_requeued
from slurm_robust.slurm.runner import (
    DEFAULT_POLICY,
    NO_RETRY,
    RetryPolicy,
    SlurmCommandError,
    run_slurm_command,
)

_JOB_ID = re.compile(r"^\d+(_\d+)?(\+\d+)?$")
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
# Reasons end up in slurm.conf-style key=value lines; keep them one printable line.
MAX_REASON = 200
# The "[user@time]" scontrol appends to a node's Reason.
_REASON_STAMP = re.compile(r"\s*\[[^\]\s]*@[^\]\s]*\]$")


def check_job_id(job_id: str | int) -> str:
    """Return the job id as a string, or raise UsageError for anything that is not one."""
    text = str(job_id).strip()
    if not _JOB_ID.match(text):
        raise UsageError(f"{job_id!r} is not a Slurm job id")
    return text


def check_node_name(node: str) -> str:
    if not _NODE_NAME.match(node or ""):
        raise UsageError(f"{node!r} is not a valid node name")
    return node


def clean_reason(reason: str) -> str:
    """One printable line, bounded, so it cannot smuggle key=value pairs or newlines."""
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in reason).split())
    return text[:MAX_REASON] or "unspecified"


@dataclass(frozen=True)
class PyslurmStatus:
    usable: bool
    why: str


def pyslurm_status(slurm_version: str | None) -> PyslurmStatus:
    """Whether an installed pyslurm matches the running Slurm (major.minor).

    A report only: no code path uses pyslurm, every call runs Slurm's commands.
    """
    try:
        import pyslurm  # type: ignore[import-not-found]
    except ImportError:
        return PyslurmStatus(False, "pyslurm is not installed; using Slurm's commands")
    version = str(getattr(pyslurm, "__version__", ""))
    want = ".".join((slurm_version or "").split(".")[:2])
    have = ".".join(version.split(".")[:2])
    if not want or have != want:
        return PyslurmStatus(False, f"pyslurm {version} does not match Slurm {slurm_version}; "
                                    "using Slurm's commands")
    return PyslurmStatus(True, f"pyslurm {version} matches Slurm {slurm_version}")


class Slurm:
    """Typed access to one Slurm cluster through its commands.

    Args:
        env: extra environment for every command (e.g. ``{"SLURM_CONF": ...}``).
        policy: timeout and retry policy for read and idempotent calls.
    """

    def __init__(self, env: Mapping[str, str] | None = None,
                 policy: RetryPolicy = DEFAULT_POLICY) -> None:
        self.env = dict(env or {})
        self.policy = policy

    def _run(self, argv: Sequence[str], policy: RetryPolicy | None = None,
             input_text: str | None = None) -> str:
        return run_slurm_command(argv, policy=policy or self.policy, env=self.env,
                                 input_text=input_text).stdout

    # --- cluster ---------------------------------------------------------------------
    def ping(self) -> bool:
        """True when slurmctld answers."""
        try:
            self._run(["scontrol", "ping"], RetryPolicy(attempts=1, timeout_s=10))
            return True
        except SlurmCommandError:
            return False

    def config(self) -> dict[str, str]:
        """slurmctld's running configuration (``scontrol show config``) as key -> value."""
        out: dict[str, str] = {}
        for line in self._run(["scontrol", "show", "config"]).splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() and " " not in key.strip():
                out[key.strip()] = value.strip()
        return out

    def version(self) -> str:
        out = self._run(["sinfo", "--version"]).split()
        return out[-1] if out else ""

    # --- nodes -----------------------------------------------------------------------
    def nodes(self, names: Iterable[str] | None = None) -> list[Node]:
        """All nodes (or the named ones, in Slurm's order)."""
        out = parse_sinfo_json(self._run(["sinfo", "--json"]))
        if names is None:
            return out
        wanted = set(names)
        return [n for n in out if n.name in wanted]

    def node(self, name: str) -> Node:
        found = self.nodes([check_node_name(name)])
        if not found:
            raise UsageError(f"node {name!r} is not in this cluster")
        return found[0]

    def update_node(self, name: str, state: str, reason: str | None = None) -> None:
        """``scontrol update nodename=N state=S [reason=R]``."""
        argv = ["scontrol", "update", f"nodename={check_node_name(name)}", f"state={state}"]
        if reason is not None:
            argv.append(f"reason={clean_reason(reason)}")
        self._run(argv, NO_RETRY if state.lower() == "resume" else None)

    def drain(self, name: str, reason: str) -> None:
        self.update_node(name, "drain", reason)

    def resume(self, name: str) -> None:
        self.update_node(name, "resume")

    def node_state_reason(self, name: str) -> tuple[str, str]:
        """(state, reason) of one node from ``scontrol show node -o``: one light call for
        programs polled on every node. ``state`` is ``drained`` (DRAIN, no job left),
        ``draining`` (DRAIN, jobs still there) or the base state in lower case; the reason
        is "" when none, without Slurm's ``[user@time]`` suffix.

        (Not ``sinfo %T``: it says ``reserved`` for a drained node in a reservation.)
        """
        out = self._run(["scontrol", "show", "node", check_node_name(name), "-o"]).strip()
        fields = parse_scontrol_oneliner(out.splitlines()[0]) if out else {}
        if fields.get("NodeName") != name:
            raise UsageError(f"node {name!r} is not in this cluster")
        parts = fields.get("State", "").upper().split("+")
        busy = parts[0] in ("ALLOCATED", "MIXED", "COMPLETING") or "COMPLETING" in parts
        if "DRAIN" in parts:
            state = "draining" if busy else "drained"
        else:
            state = parts[0].lower()
        reason = _REASON_STAMP.sub("", fields.get("Reason", "")).strip()
        return state, "" if reason == "(null)" else reason

    def node_address(self, name: str) -> str:
        """The address slurmctld reaches a node at (NodeAddr, else NodeHostname, else name)."""
        out = self._run(["scontrol", "show", "node", check_node_name(name), "-o"]).strip()
        fields = parse_scontrol_oneliner(out.splitlines()[0]) if out else {}
        return fields.get("NodeAddr") or fields.get("NodeHostname") or name

    def hostnames(self, expr: str) -> list[str]:
        """Expand a hostlist with ``scontrol show hostnames``."""
        return self._run(["scontrol", "show", "hostnames", expr]).split()

    # --- partitions ------------------------------------------------------------------
    def partition(self, name: str) -> dict[str, str]:
        """``scontrol show partition NAME -o`` as a dict (Nodes, State, ...)."""
        out = self._run(["scontrol", "show", "partition", name, "-o"]).strip()
        if not out:
            raise UsageError(f"partition {name!r} does not exist")
        return parse_scontrol_oneliner(out.splitlines()[0])

    def partitions_raw(self) -> str:
        """``scontrol show partition -o``: one line per partition."""
        return self._run(["scontrol", "show", "partition", "-o"])

    def partition_members(self) -> dict[str, set[str]]:
        """Every partition's nodes from one ``scontrol show partition -o`` call, the
        hostlists expanded here (no ``scontrol show hostnames`` per partition)."""
        out: dict[str, set[str]] = {}
        for line in self.partitions_raw().splitlines():
            if line.strip():
                part = parse_scontrol_oneliner(line)
                nodes = part.get("Nodes", "")
                out[part.get("PartitionName", "")] = set(
                    () if nodes in ("", "(null)") else expand_hostlist(nodes))
        return out

    def partition_nodes(self, name: str) -> list[str]:
        nodes = self.partition(name).get("Nodes", "")
        return [] if nodes in ("", "(null)") else self.hostnames(nodes)

    def set_partition_nodes(self, name: str, nodes: Sequence[str]) -> None:
        """``scontrol update PartitionName=P Nodes=...`` (empty list allowed)."""
        for n in nodes:
            check_node_name(n)
        self._run(["scontrol", "update", f"PartitionName={name}",
                   f"Nodes={','.join(nodes)}"])

    def create_partition(self, name: str, nodes: Sequence[str]) -> None:
        """``scontrol create PartitionName=P Nodes=... State=UP`` (a runtime partition)."""
        for n in nodes:
            check_node_name(n)
        self._run(["scontrol", "create", f"PartitionName={check_node_name(name)}",
                   f"Nodes={','.join(nodes)}", "State=UP", "MaxTime=INFINITE"], NO_RETRY)

    def delete_partition(self, name: str) -> None:
        self._run(["scontrol", "delete", f"PartitionName={check_node_name(name)}"], NO_RETRY)

    def create_reservation(self, name: str, nodes: Sequence[str], users: Sequence[str],
                           duration_min: int) -> None:
        """A reservation from now: only jobs asking for it (``--reservation``) use ``nodes``."""
        for n in nodes:
            check_node_name(n)
        self._run(["scontrol", "create", "reservation", f"ReservationName={check_node_name(name)}",
                   f"Nodes={','.join(nodes)}",
                   f"Users={','.join(check_node_name(u) for u in users)}", "StartTime=now",
                   f"Duration={int(duration_min)}"], NO_RETRY)

    def delete_reservation(self, name: str) -> None:
        self._run(["scontrol", "delete", f"ReservationName={check_node_name(name)}"], NO_RETRY)

    # --- jobs ------------------------------------------------------------------------
    def jobs(self, job_ids: Iterable[str | int] | None = None,
             user: str | None = None) -> list[Job]:
        out = parse_squeue_json(self._run(["squeue", "--json"]))
        if job_ids is not None:
            wanted = {check_job_id(j) for j in job_ids}
            out = [j for j in out if j.job_id in wanted]
        if user is not None:
            out = [j for j in out if j.user == user]
        return out

    def job(self, job_id: str | int) -> Job | None:
        found = self.jobs([job_id])
        return found[0] if found else None

    def sbatch(self, args: Sequence[str], script: str | None = None,
               script_path: str | os.PathLike[str] | None = None) -> str:
        """Submit a job; returns its id. ``script`` is passed on stdin, never via a shell."""
        if (script is None) == (script_path is None):
            raise UsageError("give exactly one of script or script_path")
        argv = ["sbatch", "--parsable", *args]
        if script_path is not None:
            argv.append(str(script_path))
        # Not retried: a timed-out sbatch may have submitted the job.
        out = self._run(argv, NO_RETRY, input_text=script).strip()
        job_id = out.split(";")[0]
        try:
            return check_job_id(job_id)
        except UsageError as exc:
            raise SlurmParseError(f"sbatch printed {out!r}, not a job id") from exc

    def requeue(self, job_id: str | int, start_now: bool = True, hold: bool = False,
                timeout_s: float = 60.0) -> None:
        """Requeue a job; with ``start_now`` start it again within seconds instead of
        after Slurm's BeginTime hold (``cred_expire``, ~120 s): see restart.py for when
        the StartTime reset is safe. Raises SlurmCommandError if the job is still on its
        way back to the queue after ``timeout_s``."""
        jid = check_job_id(job_id)
        self._run(["scontrol", "requeuehold" if hold else "requeue", jid], NO_RETRY)
        if not start_now or hold:
            return
        what = start_requeued(self, jid, time.time(), timeout_s)
        if what.startswith("job still"):
            raise SlurmCommandError(["scontrol", "requeue", jid], None, what)

    def update_job(self, job_id: str | int, **fields: str) -> None:
        """``scontrol update jobid=J Key=Value ...``."""
        argv = ["scontrol", "update", f"jobid={check_job_id(job_id)}"]
        for key, value in fields.items():
            if not key.isidentifier():
                raise UsageError(f"bad job field {key!r}")
            argv.append(f"{key}={value}")
        self._run(argv)

    def cancel(self, job_id: str | int, signal: str | None = None) -> None:
        argv = ["scancel", check_job_id(job_id)]
        if signal:
            argv[1:1] = [f"--signal={signal}"]
        self._run(argv)

    # --- accounting ------------------------------------------------------------------
    def sacct_raw(self, fields: Sequence[str], args: Sequence[str] = ()) -> str:
        """``sacct --parsable2 --noheader --format=F1,F2,... ARGS`` output, unparsed."""
        return self._run(["sacct", "--parsable2", "--noheader",
                          f"--format={','.join(fields)}", *args])

    def sacct(self, job_ids: Iterable[str | int] | None = None,
              args: Sequence[str] = ()) -> list[AcctJob]:
        """Accounting records (job allocations only, ``-X``) as typed records."""
        extra = ["-X", *args]
        if job_ids is not None:
            extra += ["-j", ",".join(check_job_id(j) for j in job_ids)]
        return parse_sacct_parsable(self.sacct_raw(SACCT_FIELDS, extra))

    def node_events_raw(self, fields: Sequence[str] = ("Cluster", "NodeName", "Start", "End",
                                                       "State", "Reason", "User"),
                        args: Sequence[str] = ()) -> str:
        """``sacctmgr show event`` with ``--parsable2 --noheader``, unparsed."""
        return self._run(["sacctmgr", "--parsable2", "--noheader", "show", "event",
                          f"format={','.join(fields)}", *args])

    def drain_reasons_raw(self) -> str:
        """``sinfo -R`` as ``node|state|reason|user|time`` lines, unparsed."""
        return self._run(["sinfo", "-R", "-h", "-N", "-o", "%N|%T|%E|%u|%H"])
