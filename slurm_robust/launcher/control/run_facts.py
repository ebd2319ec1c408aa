"""From the run to the ladder: a failure's incident, and the facts ``ladder.decide`` takes.

:func:`failure_incident` builds the incident of a worker's (or an agent's) failure from
what its exit said; :func:`ladder_facts` counts the incident into the run (attempts
without progress, the named nodes' failures) and returns the ladder's input. The applier
(applier.py) calls both; the ladder itself is pure (ladder.py).
"""

from __future__ import annotations

from typing import Any

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control import env_change
from slurm_robust.launcher.control.actions import Handle
from slurm_robust.launcher.control.events import new_incident
from slurm_robust.launcher.control.generation import Failure, Generation
from slurm_robust.launcher.control.ladder import Facts
from slurm_robust.launcher.control.outage import service_of, startup_outage
from slurm_robust.launcher.control.policy import UNLOCALISED_CLASSES, made_progress
from slurm_robust.launcher.control.state import RunState
from slurm_robust.launcher.enums import IncidentClass
from slurm_robust.launcher.messages import Incident
from slurm_robust.taxonomy import node_side


def failure_incident(incident_id: str, gen: Generation, root: Failure, detected: float,
                     st: RunState) -> Incident:
    """The incident of ``root``, the earliest failure of ``gen`` (the others are named in
    its evidence)."""
    ex = root.exit
    others = sorted({f.exit.rank for f in gen.failures if f is not root})
    # Open-ended: the exit's own evidence (a classifier's, an agent's) is merged in.
    evidence: dict[str, Any] = {k: v for k, v in (("exit_code", ex.exit_code),
                                                  ("signal", ex.signal), ("line", ex.line),
                                                  ("log", ex.log)) if v is not None}
    evidence.update(ex.evidence)
    if others:
        evidence["also_failed_ranks"] = others
    ch = st.env_change
    if ex.cls == IncidentClass.CODE_DATA_CHANGE and ch is not None and \
            env_change.recent(ch, st.last_step):
        # The change the classifier counted (made outside `update`): what changed,
        # and from which step, in the incident itself, not only in state.json.
        evidence["env_change"] = {k: ch[k] for k in ("step", "attempt", "what")
                                  if k in ch}
    return new_incident(incident_id, str(ex.cls), str(ex.category), detected,
                        fault_time=ex.time, nodes=[root.node], ranks=[ex.rank],
                        last_step=st.last_step, evidence=evidence)


def ladder_facts(h: Handle, st: RunState, cfg: RunConfig, controller_node: str,
                 spares_left: int, reports_steps: bool, batch_node: str | None,
                 rollback: str | None, now: float) -> Facts:
    """What the ladder needs for ``h``'s incident. Counts it first: the run's attempts
    without progress and the named nodes' failures include this one."""
    gen, incident = h.gen, h.incident
    progressed = made_progress(gen.steps_done, reports_steps, now - gen.started_at)
    cls = incident.cls
    outage = count_outage(st, str(cls), progressed, now)
    if not outage:  # a service's outage at start-up has its own budget, not this one
        st.no_progress = 0 if progressed else st.no_progress + 1
    if cls not in UNLOCALISED_CLASSES:
        for node in h.nodes:
            st.node_failures[node] = st.node_failures.get(node, 0) + 1
    # Why the nodes were or were not blamed by count, for the post-mortem reader.
    incident.evidence["blame"] = {
        "node_side": node_side(str(cls), h.side),
        "failures": {n: st.node_failures.get(n, 0) for n in h.nodes},
        "threshold": cfg.node_failures_to_blame}
    stalled = False
    if cls == IncidentClass.TIME_LIMIT:
        # No new step since the previous allocation's warning: this one made none.
        stalled = st.time_limits > 0 and st.last_step == st.time_limit_step
        st.time_limit_step, st.time_limits = st.last_step, st.time_limits + 1
    signature = h.signature
    return Facts(
        cls=cls, controller_node=controller_node, spares_left=spares_left,
        restarts=st.restarts, max_restarts=cfg.max_restarts, signature=signature,
        signature_seen=st.signatures.get(signature or "", 0),
        no_progress=st.no_progress, max_no_progress=cfg.max_no_progress,
        named=tuple(h.nodes), failures={n: st.node_failures.get(n, 0) for n in h.nodes},
        failures_to_blame=cfg.node_failures_to_blame,
        blame_named=bool(h.evict) or h.diagnosis_failed,
        diagnosed_repeat=h.diagnosed_repeat, batch_node=batch_node,
        nan_advice=h.override, evict_reason=h.evict, rollback=rollback,
        diagnosis_reason=(incident.evidence.get("diagnosis_reason")
                          if h.diagnosis_failed else None),
        blamed_before=tuple(st.blamed),
        max_blamed=cfg.max_blamed_nodes or cfg.total_nodes,
        side=h.side, diagnosis_passed=h.diagnosis_passed, time_limit_stalled=stalled,
        outage_failures=st.outage_failures if outage else 0,
        outage_s=now - st.outage_since if outage and st.outage_since is not None else 0.0,
        outage_service=(service_of(incident.evidence, incident.evidence.get("line"))
                        if outage else None),
        outage_budget_s=cfg.outage_budget_s, outage_backoff_s=cfg.outage_backoff_s,
        outage_backoff_max_s=cfg.outage_backoff_max_s)


def count_outage(st: RunState, cls: str, progressed: bool, now: float) -> bool:
    """Count a failure into the run's outage (outage.py); True when it is a service's
    outage at start-up. Any other failure ends the outage, a time limit excepted (an
    allocation's end says nothing about the service; the outage goes on after it)."""
    if startup_outage(cls, progressed):
        st.outage_since = now if st.outage_since is None else st.outage_since
        st.outage_failures += 1
        return True
    if cls != IncidentClass.TIME_LIMIT:
        end_outage(st)
    return False


def end_outage(st: RunState) -> None:
    """The outage is over (a step finished, or a failure of another class)."""
    st.outage_since, st.outage_failures, st.outage_not_before = None, 0, None
