"""Typed records of Slurm objects, and pure parsers from Slurm's output.

Parsers take strings (recorded output works as well as live output), so they are
tested without a cluster; the client in ``client.py`` only runs commands and calls them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from slurm_robust.slurm.hostlist import expand_hostlist


class SlurmParseError(ValueError):
    """Slurm printed something this parser does not understand."""


@dataclass(frozen=True)
class Node:
    """A node as ``sinfo --json`` reports it.

    ``state`` is the base state in lower case (``idle``, ``allocated``, ``mixed``,
    ``down``, ...); ``flags`` are Slurm's state flags (``DRAIN``, ``NOT_RESPONDING``, ...).
    """

    name: str
    state: str
    flags: frozenset[str]
    reason: str
    reason_user: str
    reason_time: int
    partitions: tuple[str, ...]
    cpus: int
    alloc_cpus: int
    #: Where slurmctld reaches the node's slurmd (NodeAddr, Port); "" and 0 when unknown.
    address: str = ""
    port: int = 0

    @property
    def drained(self) -> bool:
        """Drained or draining: the scheduler gives it no new jobs."""
        return "DRAIN" in self.flags

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.flags

    @property
    def usable(self) -> bool:
        """Can take a job now: up, answering, not drained."""
        return self.responding and not self.drained and self.state not in ("down", "unknown",
                                                                         "future")

    @property
    def idle(self) -> bool:
        return self.usable and self.state == "idle" and self.alloc_cpus == 0


@dataclass(frozen=True)
class Job:
    """A job as ``squeue --json`` reports it (times are Unix seconds, 0 when unset)."""

    job_id: str
    name: str
    user: str
    state: str
    state_reason: str
    partition: str
    nodes: tuple[str, ...]
    node_count: int
    batch_host: str
    restart_count: int
    requeue: bool
    submit_time: int
    start_time: int
    end_time: int
    exit_code: int
    comment: str
    work_dir: str

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES


FINISHED_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                             "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})


@dataclass(frozen=True)
class AcctJob:
    """One line of ``sacct --parsable2`` with the fields in ``SACCT_FIELDS``."""

    job_id: str
    name: str
    user: str
    state: str
    exit_code: str
    nodes: tuple[str, ...]
    submit: str
    start: str
    end: str
    elapsed_s: int
    partition: str


SACCT_FIELDS = ("JobID", "JobName", "User", "State", "ExitCode", "NodeList",
                "Submit", "Start", "End", "ElapsedRaw", "Partition")


def _load_json(text: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SlurmParseError(f"{what} did not print JSON: {text[:200]!r}") from exc
    if not isinstance(data, dict):
        raise SlurmParseError(f"{what} printed JSON that is not an object")
    return data


def _int(value: Any, default: int = 0) -> int:
    if value is None or isinstance(value, bool):
        return default
    if isinstance(value, dict):  # newer Slurm: {"set": true, "number": N}
        return int(value.get("number", default)) if value.get("set", True) else default
    return int(value)


def parse_sinfo_json(text: str) -> list[Node]:
    """Parse ``sinfo --json`` (Slurm 22.05, openapi v0.0.38; later versions tolerated)."""
    data = _load_json(text, "sinfo --json")
    out = []
    for n in data.get("nodes", []):
        state = n.get("state", "unknown")
        flags = list(n.get("state_flags", []))
        if isinstance(state, list):  # 23.x+: state is a list of flags
            flags += state[1:]
            state = state[0] if state else "unknown"
        out.append(Node(
            name=n["name"], state=str(state).lower(),
            flags=frozenset(str(f).upper() for f in flags),
            reason=n.get("reason") or "", reason_user=n.get("reason_set_by_user") or "",
            reason_time=_int(n.get("reason_changed_at")),
            partitions=tuple(n.get("partitions") or ()),
            cpus=_int(n.get("cpus")), alloc_cpus=_int(n.get("alloc_cpus")),
            address=str(n.get("address") or ""), port=_int(n.get("port"))))
    return out


def parse_squeue_json(text: str) -> list[Job]:
    """Parse ``squeue --json`` (Slurm 22.05; later versions tolerated)."""
    data = _load_json(text, "squeue --json")
    out = []
    for j in data.get("jobs", []):
        state = j.get("job_state", "")
        if isinstance(state, list):
            state = state[0] if state else ""
        exit_code = j.get("exit_code", 0)
        if isinstance(exit_code, dict):
            exit_code = _int(exit_code.get("return_code"))
        out.append(Job(
            job_id=str(j["job_id"]), name=j.get("name", ""), user=j.get("user_name", ""),
            state=str(state), state_reason=j.get("state_reason", ""),
            partition=j.get("partition", ""),
            nodes=tuple(expand_hostlist(j.get("nodes") or "")),
            node_count=_int(j.get("node_count")), batch_host=j.get("batch_host") or "",
            restart_count=_int(j.get("restart_cnt")), requeue=bool(j.get("requeue")),
            submit_time=_int(j.get("submit_time")), start_time=_int(j.get("start_time")),
            end_time=_int(j.get("end_time")), exit_code=_int(exit_code),
            comment=j.get("comment") or "", work_dir=j.get("current_working_directory") or ""))
    return out


def parse_sacct_parsable(text: str) -> list[AcctJob]:
    """Parse ``sacct --parsable2 --noheader --format=<SACCT_FIELDS>``."""
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != len(SACCT_FIELDS):
            raise SlurmParseError(f"sacct line {lineno} has {len(parts)} fields, expected "
                                  f"{len(SACCT_FIELDS)}: {line!r}")
        (job_id, name, user, state, exit_code, nodelist, submit, start, end,
         elapsed, partition) = parts
        out.append(AcctJob(job_id=job_id, name=name, user=user, state=state,
                           exit_code=exit_code,
                           nodes=tuple(expand_hostlist(nodelist)) if nodelist != "None assigned"
                           else (),
                           submit=submit, start=start, end=end,
                           elapsed_s=int(elapsed or 0), partition=partition))
    return out


def parse_scontrol_oneliner(text: str) -> dict[str, str]:
    """Parse one ``scontrol show ... -o`` line into a dict.

    Values may contain spaces only in the trailing ``Reason=``/``Comment=`` style keys;
    splitting on `` Key=`` boundaries handles those.
    """
    out: dict[str, str] = {}
    key = None
    for token in text.strip().split(" "):
        if "=" in token and token.split("=", 1)[0].isidentifier():
            key, value = token.split("=", 1)
            out[key] = value
        elif key is not None:
            out[key] += " " + token
    return out
