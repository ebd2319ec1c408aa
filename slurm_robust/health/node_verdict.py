"""One verdict document per suite run: the node's severity, each check's, what to do next.

Levels as NVIDIA Health Validation defines them (PASS, INFO, WARNING, CRITICAL, UNKNOWN),
so a site that already routes those verdicts reads ours the same way. From a check's
status: ``ok`` PASS, ``skip`` INFO, ``warn`` WARNING, ``fail`` CRITICAL, ``error``
UNKNOWN (the check could not run). The node's level is the worst that counts: CRITICAL
when a check failed; UNKNOWN when a fail-closed check (``on_error: closed``) could not
run; an error of a fail-open check is a WARNING of the node (it is in the document, and
not a reason to take the node out). So the exit code, 0 for PASS/INFO/WARNING and 1 for
CRITICAL/UNKNOWN (2: no verdict at all, a configuration error), is 0 exactly when the
node would be admitted.

The suite writes the newest document of a node next to its health journal
(``<state_dir>/health/<node>.verdict.json``); the prolog, the epilog, ``slurm-robust
check`` and the deep check all write it through the suite, and the exporter reads it.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from pathlib import Path
from typing import Any

from slurm_robust.health.framework import CheckResult, Status
from slurm_robust.health.journal import journal_path
from slurm_robust.records import make_record, read_json_bounded, write_json_atomic
from slurm_robust.site_config import SiteConfig

log = logging.getLogger("slurm_robust.health")

VERDICT_SCHEMA = "slurm_robust.node_verdict"
VERDICT_VERSION = 1
#: Bound on what a reader accepts: a document is a few KiB.
MAX_DOCUMENT_BYTES = 1 << 20


class Severity(StrEnum):
    PASS = "PASS"
    INFO = "INFO"
    WARNING = "WARNING"
    UNKNOWN = "UNKNOWN"
    CRITICAL = "CRITICAL"


#: Worst last: the node's level is the highest rank among the levels that count.
RANK = {s: i for i, s in enumerate(Severity)}
OF_STATUS = {Status.OK: Severity.PASS, Status.SKIP: Severity.INFO,
             Status.WARN: Severity.WARNING, Status.FAIL: Severity.CRITICAL,
             Status.ERROR: Severity.UNKNOWN}

EXIT_ADMIT, EXIT_NOT_ADMIT, EXIT_NO_VERDICT = 0, 1, 2

#: What an admin does next about a CRITICAL check, by check name prefix (first match).
#: Every failed check's node is drained by the caller; these are the steps after that.
ACTIONS_BY_PREFIX: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gpu_xid", ("reset the GPU or reboot the node", "run the deep check again",
                 "open a hardware ticket if the Xid repeats after a reboot")),
    ("gpu_ecc", ("reboot the node (pending retirements and row remaps apply at reset)",
                 "open a hardware ticket if uncorrectable errors persist")),
    ("gpu_remap", ("reboot the node to apply the row remapping",
                   "open a hardware ticket if remapping failed (no spare rows)")),
    ("nvml", ("reboot the node (the driver does not answer)",
              "check the driver and the GPU's PCIe link if it persists")),
    ("gpu_", ("reboot the node", "run the deep check again",
              "open a hardware ticket if it fails again")),
    ("net_", ("check the port, cable and switch side of the link",
              "run the deep check again once the link is up")),
    ("host_", ("free the resource (disk, memory, stray processes) or find who holds it",
               "return the node with slurm-robust node resume")),
    ("deep_", ("run the deep check again after a reboot",
               "open a hardware ticket if it fails again")),
)
DEFAULT_ACTIONS = ("run the deep check again (slurm-robust node resume)",)
UNKNOWN_ACTIONS = ("read the check program's error in the reason and fix its cause; the "
                   "check's verdict is unknown until it runs",)


def check_severity(result: CheckResult) -> Severity:
    return OF_STATUS[result.status]


def recommended(result: CheckResult) -> list[str]:
    """The next steps for one check's result ([] when nothing is to be done)."""
    sev = check_severity(result)
    if sev is Severity.UNKNOWN:
        return list(UNKNOWN_ACTIONS)
    if sev is not Severity.CRITICAL:
        return []
    for prefix, steps in ACTIONS_BY_PREFIX:
        if result.check.startswith(prefix):
            return list(steps)
    return list(DEFAULT_ACTIONS)


def node_severity(results: list[CheckResult]) -> Severity:
    """The node's level (module doc): a fail-open check's error counts as a WARNING."""
    worst = Severity.PASS
    for r in results:
        sev = check_severity(r)
        if sev is Severity.UNKNOWN and not r.blocks_admission:
            sev = Severity.WARNING
        worst = max(worst, sev, key=RANK.__getitem__)
    return worst


def exit_code(severity: Severity) -> int:
    """Health Validation's convention: 0 the node may stay, 1 it should not."""
    return EXIT_NOT_ADMIT if severity in (Severity.CRITICAL, Severity.UNKNOWN) else EXIT_ADMIT


def document(node: str, job: str | None, stage: str, suite: str, run_id: str,
             results: list[CheckResult], now: float) -> dict[str, Any]:
    """The verdict document of one suite run (schema in docs/SCHEMAS.md)."""
    checks = [{"check": r.check, "severity": check_severity(r).value,
               "status": r.status.value, "reason": r.reason, "evidence": r.evidence,
               "on_error": r.on_error, "actions": recommended(r)} for r in results]
    actions: list[str] = []
    for c in checks:
        actions += [a for a in c["actions"] if a not in actions]
    severity = node_severity(results)
    return make_record(VERDICT_SCHEMA, VERDICT_VERSION, {
        "node": node, "job": job, "stage": stage, "suite": suite, "run_id": run_id,
        "severity": severity.value, "exit_code": exit_code(severity),
        "counts": {s.value: sum(1 for c in checks if c["severity"] == s.value)
                   for s in Severity},
        "actions": actions, "checks": checks}, now=now)


def document_path(node: str, config: SiteConfig | None = None) -> Path:
    """Beside the node's health journal."""
    return journal_path(node, config).with_name(f"{node}.verdict.json")


def write_document(path: Path, doc: dict[str, Any]) -> None:
    """Replace the node's newest document (atomic: a reader sees the old or the new)."""
    write_json_atomic(path, doc, mode=0o644)


def read_document(node: str, config: SiteConfig | None = None) -> dict[str, Any] | None:
    """The node's newest verdict document; None when there is none or it is unreadable
    (not ours, too large, not a v1 document: logged)."""
    path = document_path(node, config)
    try:
        doc = read_json_bounded(path, MAX_DOCUMENT_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("verdict document %s not read: %s", path, exc)
        return None
    except ValueError:  # too large, or not JSON
        doc = None
    if not isinstance(doc, dict) or doc.get("schema") != VERDICT_SCHEMA \
            or doc.get("v") != VERDICT_VERSION or doc.get("severity") not in set(Severity):
        log.warning("verdict document %s is not a %s v%d document; ignored", path,
                    VERDICT_SCHEMA, VERDICT_VERSION)
        return None
    return doc
