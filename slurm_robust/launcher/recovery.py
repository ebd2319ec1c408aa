"""Applying the ladder: what the controller does once policy.py has decided.

Every function takes the controller (holding its lock) and changes its plans, its
generation and the persisted run state, and writes the event log. Incidents follow
docs/SCHEMAS.md: detected when the controller first saw the failure, localized when the
culprit was named, recovered when the first step after the restored one finished.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from slurm_robust.ckpt.config import TIERS
from slurm_robust.launcher import failslow
from slurm_robust.launcher.events import make_incident
from slurm_robust.launcher.policy import (
    Decision,
    LadderInput,
    blamed_nodes,
    decide,
    made_progress,
    rendezvous_port,
)
from slurm_robust.launcher.requeue import drain_directly, requeue_job, write_verdict
from slurm_robust.slurm import SlurmCommandError
from slurm_robust.stacks.failslow import FailSlowDecision

if TYPE_CHECKING:
    from slurm_robust.launcher.controller import Controller, Generation

log = logging.getLogger("slurm_robust.launcher.recovery")

#: Wait this long after the first primary failure for the others of the same moment.
SETTLE_S = 0.3
#: Longest wait for stack captures on a hang before restarting anyway.
CAPTURE_BUDGET_S = 20.0


def begin_generation(ctl: Controller, slots: list[int], now: float) -> None:
    """Start a new generation of workers on ``slots`` (agent indices, one per slot)."""
    from slurm_robust.launcher.controller import Generation

    st = ctl.state
    st.attempt += 1
    ctl.events.attempt = st.attempt
    ctl.gen_count += 1
    gen = Generation(ctl.gen_count, st.attempt, list(slots), now)
    ctl.gen = gen
    st.slots = [ctl.agents[i].node for i in slots]
    g = ctl.cfg.workers_per_node
    rank_nodes = [ctl.agents[i].node for i in slots for _ in range(g)]
    ctl.failslow = failslow.new_monitor(ctl.cfg, rank_nodes)
    common = {"gen": gen.number, "attempt": st.attempt, "world_size": ctl.cfg.world_size,
              "master_addr": ctl.agents[slots[0]].addr,
              "master_port": rendezvous_port(ctl.cfg.master_port, ctl.ident.job_id,
                                             st.attempt),
              "rank_nodes": rank_nodes, "run_id": st.run_id,
              "max_restarts": ctl.cfg.max_restarts}
    ctl.plans = {}
    for slot, index in enumerate(slots):
        ctl.plans[index] = {**common, "role": "active", "slot": slot,
                            "ranks": list(range(slot * g, (slot + 1) * g))}
    for index, view in ctl.agents.items():
        if index in slots or view.lost:
            continue
        role = "spare" if index in ctl.spares else "evicted"
        ctl.plans[index] = {"gen": gen.number, "role": role, "attempt": st.attempt}
    ctl.phase = "running"
    ctl.persist()
    log.info("generation %s (attempt %s) on %s, spares %s", gen.number, st.attempt,
             st.slots, [ctl.agents[i].node for i in ctl.spares])


def announce_attempt(ctl: Controller, gen: Generation) -> None:
    """Write ``attempt_start`` once the ranks said what they restored (or stepped)."""
    gen.announced = True
    step, tier = restored_of(gen)
    ctl.events.attempt_start(list(ctl.state.slots), step, tier)


def restored_of(gen: Generation) -> tuple[int | None, str | None]:
    """The common restored step and the slowest tier that served a rank."""
    steps = {s for s, _ in gen.restored.values()}
    tiers = [t for _, t in gen.restored.values() if t in TIERS]
    step = steps.pop() if len(steps) == 1 else (min((s for s in steps if s is not None),
                                                    default=None))
    tier = max(tiers, key=TIERS.index) if tiers else None
    return step, tier


def maybe_handle_failures(ctl: Controller, gen: Generation, now: float) -> None:
    """Decide once the root cause is clear: the earliest primary failure after a short
    settle time, or the earliest secondary one after a heartbeat timeout."""
    primary = [f for f in gen.failures if not f.get("secondary")]
    first_seen = gen.first_failure_seen or now
    if primary:
        if now - min(f["seen"] for f in primary) < SETTLE_S:
            return
        root = min(primary, key=lambda f: f["time"])
    elif now - first_seen < ctl.cfg.heartbeat_timeout_s:
        return
    else:
        root = min(gen.failures, key=lambda f: f["time"])
    incident = _incident_from_failure(ctl, gen, root, first_seen)
    handle(ctl, gen, incident, root.get("signature"), [root["node"]], now)


def _incident_from_failure(ctl: Controller, gen: Generation, root: dict[str, Any],
                           detected: float) -> dict[str, Any]:
    st = ctl.state
    st.incidents += 1
    others = sorted({int(f["rank"]) for f in gen.failures if f is not root})
    evidence = {k: root.get(k) for k in ("exit_code", "signal", "line", "log") if root.get(k)
                is not None}
    evidence.update(root.get("evidence") or {})
    if others:
        evidence["also_failed_ranks"] = others
    return make_incident(f"i{st.incidents}", root["class"], root["category"], detected,
                         fault_time=root.get("time"), nodes=[root["node"]],
                         ranks=[int(root["rank"])], last_step=st.last_step,
                         evidence=evidence)


def handle(ctl: Controller, gen: Generation, incident: dict[str, Any],
           signature: str | None, nodes: list[str], now: float) -> None:
    """Run the ladder for one incident and apply the decision."""
    st = ctl.state
    if st.open_incident is not None:
        _write_incident(ctl, st.open_incident)  # the earlier recovery did not finish
        st.open_incident = None
    progressed = made_progress(gen.steps_done, st.last_step is not None or bool(gen.pending),
                               now - gen.started_at)
    st.no_progress = 0 if progressed else st.no_progress + 1
    for node in nodes:
        st.node_failures[node] = st.node_failures.get(node, 0) + 1
    blamed = blamed_nodes(incident["class"], nodes, st.node_failures,
                          ctl.cfg.node_failures_to_blame)
    decision = decide(LadderInput(
        cls=incident["class"], blamed=blamed, controller_node=ctl.ident.node,
        spares_left=len(ctl.spares), restarts=st.restarts, max_restarts=ctl.cfg.max_restarts,
        signature=signature, signature_seen=st.signatures.get(signature or "", 0),
        no_progress=st.no_progress, max_no_progress=ctl.cfg.max_no_progress))
    if signature:
        st.signatures[signature] = st.signatures.get(signature, 0) + 1
    incident["rung"] = decision.rung
    incident["localized_at"] = incident["localized_at"] or now
    incident["nodes"] = sorted(set(incident["nodes"]) | set(decision.evict))
    incident["evidence"]["decision"] = decision.reason
    log.warning("incident %s: %s on %s -> %s (%s)", incident["incident"], incident["class"],
                incident["nodes"], decision.rung, decision.reason)
    if decision.rung == "stop":
        _write_incident(ctl, incident)
        finish(ctl, "stopped", decision.reason)
        return
    st.restarts += 1
    for node in decision.evict:
        write_verdict(ctl.paths, ctl.ident.job_id, node, decision.reason, incident["class"],
                      incident["evidence"], incident["incident"], ctl.cfg.site_config)
    if decision.evict and ctl.cfg.drain:
        drain_directly(list(decision.evict), decision.reason)
    st.open_incident = incident
    if decision.rung == "requeue":
        _requeue(ctl, decision)
    elif decision.rung == "spare":
        begin_generation(ctl, _replace(ctl, gen, decision), now)
    else:
        begin_generation(ctl, gen.slots, now)


def _replace(ctl: Controller, gen: Generation, decision: Decision) -> list[int]:
    slots = list(gen.slots)
    for node in decision.evict:
        for pos, index in enumerate(slots):
            if ctl.agents[index].node == node:
                slots[pos] = ctl.spares.pop(0)
                ctl.evicted.add(index)
    ctl.state.blamed = sorted(set(ctl.state.blamed) | set(decision.evict))
    return slots


def _requeue(ctl: Controller, decision: Decision) -> None:
    st = ctl.state
    st.requeues += 1
    st.blamed = sorted(set(st.blamed) | set(decision.evict))
    ctl.persist()
    gen_no = ctl.gen.number + 1 if ctl.gen else 1
    ctl.plans = {i: {"gen": gen_no, "role": "hold", "attempt": st.attempt}
                 for i in ctl.agents}
    ctl.phase = "requeued"
    try:
        requeue_job(ctl.ident.job_id, st.blamed)
    except SlurmCommandError as exc:
        finish(ctl, "failed", f"requeue refused by Slurm: {exc}")


def handle_fail_slow(ctl: Controller, gen: Generation, decision: FailSlowDecision,
                     now: float) -> None:
    """The fail-slow vote named a group: evict its node(s) through the ladder."""
    ctl.state.incidents += 1
    incident = failslow.incident_of(decision, f"i{ctl.state.incidents}", ctl.state.last_step,
                                    now, ctl.cfg.fail_slow_interval_s)
    handle(ctl, gen, incident, None, list(decision.eviction.nodes), now)


def start_hang_capture(ctl: Controller, gen: Generation, now: float) -> None:
    """A hang: ask every active agent for a stack dump before anything is killed."""
    gen.capture = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now))}-g{gen.number}"
    gen.capture_deadline = now + CAPTURE_BUDGET_S
    gen.hang_detected = now
    for index in gen.slots:
        ctl.plans[index] = {**ctl.plans[index], "stacks": gen.capture}
    ctl.phase = "dumping"
    log.warning("hang: no step for %.1f s; capturing stacks as %s", now - gen.last_progress,
                gen.capture)


def check_capture(ctl: Controller, gen: Generation, now: float) -> None:
    views = [ctl.agents[i] for i in gen.slots if not ctl.agents[i].lost]
    done = [v for v in views if gen.capture in v.stacks]
    if len(done) < len(views) and now < gen.capture_deadline:
        return
    ctl.state.incidents += 1
    evidence: dict[str, Any] = {"stacks": str(ctl.paths.stacks / str(gen.capture)),
                                "no_step_for_s": round(now - gen.last_progress, 3),
                                "captured_nodes": sorted(v.node for v in done),
                                "process_states": {v.node: v.states for v in views}}
    nodes, ranks = _analyze_capture(ctl, gen, evidence)
    stopped = {int(r): v.node for v in views for r, s in v.states.items() if s == "T"}
    if stopped:
        # A worker in state T (stopped) cannot make progress: the plainest suspect.
        # It outranks the stack grouping, which needs a clear majority to name anyone.
        evidence["stopped_ranks"] = sorted(stopped)
        ranks, nodes = sorted(stopped), sorted(set(stopped.values()))
    incident = make_incident(f"i{ctl.state.incidents}", "hang", "implicit",
                             gen.hang_detected or now, fault_time=gen.last_progress,
                             nodes=nodes, ranks=ranks, last_step=ctl.state.last_step,
                             evidence=evidence)
    incident["localized_at"] = now
    ctl.phase = "running"
    handle(ctl, gen, incident, None, [], now)


def _analyze_capture(ctl: Controller, gen: Generation,
                     evidence: dict[str, Any]) -> tuple[list[str], list[int]]:
    """Group the captured stacks; the minority groups are the suspects (evidence only:
    a hang is restarted in place, the suspects' nodes are named in the incident)."""
    try:
        from slurm_robust.stacks.analyze import analyze
        from slurm_robust.stacks.dumps import read_capture

        result = analyze(read_capture(ctl.paths.stacks / str(gen.capture)))
    except Exception as exc:  # noqa: BLE001 - analysis is evidence, never a blocker
        evidence["analysis_error"] = f"{type(exc).__name__}: {exc}"
        return [], []
    evidence["analysis"] = {"verdict": result.verdict, "reason": result.reason,
                            "outlier_ranks": list(result.outlier_ranks),
                            "nodes": result.nodes}
    return result.nodes, list(result.outlier_ranks)


def resolve_open_incident(ctl: Controller, gen: Generation, step: int, now: float) -> None:
    incident = ctl.state.open_incident
    restored, tier = restored_of(gen)
    if incident is None or (restored is not None and step <= restored):
        return
    last = incident.get("last_step")
    if restored is not None and (last is None or restored > last):
        # A controller lost with its node may not have logged the newest finished step,
        # but the snapshot holds it: that step was done before the fault.
        last = restored
        incident["last_step"] = last
    incident.update(recovered_at=now, restored_step=restored, restore_tier=tier,
                    steps_lost=max(0, (last or 0) - (restored or 0)))
    _write_incident(ctl, incident)
    ctl.state.open_incident = None
    ctl.persist()
    log.info("incident %s recovered in %.2f s (restored step %s from %s)",
             incident["incident"], now - (incident["fault_time"] or incident["detected_at"]),
             restored, tier)


def close_on_completion(ctl: Controller, gen: Generation | None, now: float) -> None:
    """The run completed with an incident still open: no step after the restore was
    reported (a script that reports no steps). The restarted group finishing is the
    proof of recovery; ``recovered_at`` is when that group started (the best known
    bound) and ``steps_lost`` is null (unknown without step reports)."""
    incident = ctl.state.open_incident
    if incident is None:
        return
    restored, tier = restored_of(gen) if gen is not None else (None, None)
    incident.update(recovered_at=gen.started_at if gen is not None else now,
                    restored_step=restored, restore_tier=tier, steps_lost=None)
    incident["evidence"]["recovery"] = ("closed at run completion: the restarted workers "
                                        "finished, no step report after the restore")
    _write_incident(ctl, incident)
    ctl.state.open_incident = None


def _write_incident(ctl: Controller, incident: dict[str, Any]) -> None:
    if incident.get("rung") is None:
        incident["rung"] = "stop"
    ctl.events.incident(incident)


def finish(ctl: Controller, status: str, verdict: str | None, write: bool = True) -> None:
    """End the run: ``run_end``, state, and an exit plan for every agent."""
    if ctl.phase == "done":
        return
    gen = ctl.gen
    final = (gen.finals.get(0) if gen else None) or {}
    step = final.get("step", ctl.state.last_step)
    if write and status == "completed" and ctl.state.open_incident is not None:
        close_on_completion(ctl, gen, time.time())
    if write:
        ctl.events.run_end(status, step, final.get("params_sha256"), verdict)
        ctl.state.finished, ctl.state.verdict = status, verdict
        ctl.persist()
    # The snapshots are keyed by job id: a resubmission (new job) cannot use them, and
    # tmpfs pages are node memory, so every ending frees them (the durable tier stays).
    ctl.plans = {i: {"role": "exit", "exit_code": 0, "purge": True} for i in ctl.agents}
    ctl.result = {"status": status, "verdict": verdict, "step": step,
                  "params_sha256": final.get("params_sha256"),
                  "attempt": ctl.state.attempt, "restarts": ctl.state.restarts}
    ctl.phase = "done"
    ctl.done_at = time.time()
    log.info("run %s: %s%s", ctl.state.run_id, status, f" ({verdict})" if verdict else "")
