"""The recovery ladder: one pure function from an incident's facts to its decision.

The launcher's recovery owner (recovery.py) and the fleet simulator (simulate/job.py)
both build a :class:`Facts` from their own state and call :func:`decide`; whatever they
then do with the :class:`Decision` (start a generation, swap a spare, requeue, stop; or
advance a simulated clock), the choice itself is made here and only here.

The rungs (docs/ARCHITECTURE.md, "The recovery ladder")::

    stop      the same user-code error after a clean restart (or the same error after its
              node passed stop-time diagnosis: an unknown or external cause), no progress
              across max_no_progress attempts, the restart budget spent, or an external
              service down at start-up for longer than the outage budget
    requeue   a node is blamed and no spare is left, or the controller's node is lost;
              and the time limit near (stop instead when a whole allocation finished no
              step since the previous one's)
    spare     a node is blamed (explicit node fault, lost heartbeat, repeated node-side
              failures, a failed diagnosis, a persistently slow rank)
    in_place  anything else: transient or unclear; an external service down at
              start-up (outage.py) restarts in place after a backoff (``delay_s``)

and the refinements applied after the rung is chosen, in this order: the NaN ladder's
advice, the evidence that named the evicted nodes, a hot update's rollback, what a failed
stop-time diagnosis found, and the cap on how many nodes one run may blame.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from slurm_robust.launcher.control.outage import backoff_s, outage_verdict
from slurm_robust.launcher.control.policy import blamed_nodes, repeat_suspects
from slurm_robust.launcher.enums import IncidentClass, Rung
from slurm_robust.taxonomy import Side, blame_cause, node_side, stops_on_repeat


@dataclass(frozen=True)
class Decision:
    """The ladder's answer. ``evict``: the nodes to drain and replace (spare, requeue).
    ``rollback``: a hot update's version failed and is rolled back (the reason).
    ``batch_lost``: the batch step's node is lost, so Slurm ends the job with it.
    ``delay_s``: start the next generation no earlier than this many seconds from now (the
    backoff of an external service's outage at start-up; 0: at once)."""

    rung: Rung
    reason: str
    evict: tuple[str, ...] = ()
    rollback: str | None = None
    batch_lost: bool = False
    delay_s: float = 0.0


@dataclass(frozen=True)
class Facts:
    """Everything one ladder decision needs, gathered before it is made.

    named: the nodes the incident names as suspects. failures: this run's failure count
    of each named node, this incident included (a node is blamed once its count reaches
    ``failures_to_blame``). blame_named: evidence names the nodes as faulty whatever the
    class (a monitor finding, a failed diagnosis, a bitwise test, a replay).
    signature_seen: earlier incidents of this run that ended in a restart with the same
    error signature. no_progress: attempts in a row, this one included, that finished no
    new step. diagnosed_repeat: the same signature came back after its node passed
    stop-time diagnosis. batch_node: the batch step's node (losing it ends the job).
    nan_advice: the NaN ladder's rung and reason, taken unless a budget already stops.
    evict_reason: the evidence that named the nodes (appended to the reason). rollback:
    set when a hot update's new version is to blame (its reason). diagnosis_reason: what
    the failed stop-time diagnosis found. blamed_before, max_blamed: the run's blamed
    nodes so far and the cap on them (None: no cap). side: the classifier's side for this
    failure (None: the class's default); with the class it decides whether repeats on a
    node count against it (taxonomy.node_side). diagnosis_passed: the named node has
    just passed a stop-time diagnosis for this incident. time_limit_stalled: a time
    limit came with no step finished since the previous allocation's.
    outage_failures: start-up failures in a row of an external service's outage, this
    one included (0: this is no such failure; outage.py); outage_s: how long the outage
    has lasted so far; outage_service: the service as the classifier saw it;
    outage_budget_s, outage_backoff_s, outage_backoff_max_s: the run's settings.
    """

    cls: str
    controller_node: str
    spares_left: int
    restarts: int
    max_restarts: int
    signature: str | None
    signature_seen: int
    no_progress: int
    max_no_progress: int
    named: tuple[str, ...] = ()
    failures: Mapping[str, int] = field(default_factory=dict)
    failures_to_blame: int = 3
    blame_named: bool = False
    diagnosed_repeat: bool = False
    batch_node: str | None = None
    nan_advice: Decision | None = None
    evict_reason: str | None = None
    rollback: str | None = None
    diagnosis_reason: str | None = None
    blamed_before: tuple[str, ...] = ()
    max_blamed: int | None = None
    side: str | None = None
    diagnosis_passed: bool = False
    time_limit_stalled: bool = False
    outage_failures: int = 0
    outage_s: float = 0.0
    outage_service: str | None = None
    outage_budget_s: float = 1800.0
    outage_backoff_s: float = 10.0
    outage_backoff_max_s: float = 300.0

    # open-ended: a trace line holds every field of Facts, whatever fields it grows
    def to_json(self) -> dict[str, Any]:
        """The facts as a trace line (tests replay recorded traces)."""
        out = dataclasses.asdict(self)
        out["failures"] = dict(self.failures)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Facts:
        kw = dict(d)
        for key in ("named", "blamed_before"):
            kw[key] = tuple(kw.get(key) or ())
        advice = kw.get("nan_advice")
        if advice is not None:
            kw["nan_advice"] = decision_from_json(advice)
        return cls(**kw)


def decision_from_json(d: Mapping[str, Any]) -> Decision:
    return Decision(Rung(d["rung"]), d["reason"], tuple(d.get("evict") or ()),
                    d.get("rollback"), bool(d.get("batch_lost", False)),
                    float(d.get("delay_s", 0.0)))


def decide(f: Facts) -> Decision:
    """The whole ladder for one incident: the rung, then every refinement in order."""
    blamed = blamed_of(f)
    d = choose_rung(f, blamed)
    d = with_nan_advice(d, f)
    d = with_evict_reason(d, f)
    d = with_rollback(d, f)
    d = with_diagnosis_reason(d, f)
    if f.max_blamed is not None:
        d = capped(d, f.blamed_before, f.max_blamed)
    return dataclasses.replace(d, rollback=f.rollback, batch_lost=batch_lost(f, blamed))


def blamed_of(f: Facts) -> tuple[str, ...]:
    """The culprits: by class or repeat count, plus every named node when evidence names
    them."""
    blamed = blamed_nodes(f.cls, f.named, f.failures, f.failures_to_blame, f.side)
    if f.blame_named:
        blamed = tuple(dict.fromkeys((*blamed, *f.named)))
    return blamed


def batch_lost(f: Facts, blamed: Collection[str]) -> bool:
    return f.cls == IncidentClass.NODE_LOST and f.batch_node is not None and \
        f.batch_node in blamed


def _stop_reason(f: Facts, blamed: tuple[str, ...]) -> str | None:
    """Why the run stops whatever is blamed, or None."""
    if f.diagnosed_repeat and f.signature is not None and not blamed:
        return (f"the same error ({f.signature}) came back after its node passed "
                f"stop-time diagnosis: {blame_cause(f.cls, f.side)}; no node is blamed")
    cleared = unexplained_repeat(f, blamed)
    if cleared:
        return (f"{f.cls} repeated {max(f.failures[n] for n in cleared)} times on "
                f"{', '.join(cleared)} and the node passed stop-time diagnosis: "
                f"{blame_cause(f.cls, f.side)}; no node is blamed")
    # A user class whose side the classifier left unknown (an exception nobody wrote a
    # rule for, the learned fallback's reading of the words) is no proof of a code bug:
    # its repeats go the unknown side's way (the node's stop-time diagnosis at the
    # repeat threshold, then a verdict naming an unknown cause), never "user code".
    if stops_on_repeat(f.cls) and f.side != Side.UNKNOWN.value and \
            f.signature is not None and f.signature_seen >= 1:
        return (f"the same user-code error ({f.signature}) came back after a clean "
                "restart; fix the training code and resubmit")
    if f.cls in (IncidentClass.NAN, IncidentClass.LOSS_SPIKE) and f.signature_seen >= 2 \
            and f.no_progress >= 2:
        return (f"{f.cls} recurs at the same place after restoring the last good "
                "snapshot; the data or the hyper-parameters need a look")
    if f.no_progress >= f.max_no_progress:
        return (f"no step finished in {f.no_progress} attempts in a row "
                f"(limit {f.max_no_progress}); last failure: {f.cls}")
    if f.restarts >= f.max_restarts:
        return f"restart budget spent ({f.restarts} of {f.max_restarts}); last failure: {f.cls}"
    return None


def unexplained_repeat(f: Facts, blamed: tuple[str, ...]) -> tuple[str, ...]:
    """The named nodes where a failure that is no evidence against a node (user side,
    unknown, off-node) reached the repeat threshold, the same error (signature) had come
    before, and the node's stop-time diagnosis then passed: restarting would only repeat
    it, evicting would blame a healthy node, so the run stops. Unrelated failures that
    happen to add up on one node in a long run restart in place."""
    if blamed or not f.diagnosis_passed or node_side(f.cls, f.side) or \
            f.signature is None or f.signature_seen < 1:
        return ()
    return repeat_suspects(f.named, dict(f.failures), f.failures_to_blame)


def choose_rung(f: Facts, blamed: tuple[str, ...]) -> Decision:
    """The rung for one incident, before any refinement."""
    if f.cls == IncidentClass.TIME_LIMIT:
        return time_limit_rung(f)
    if f.outage_failures > 0 and not blamed:
        return outage_rung(f)
    stop = _stop_reason(f, blamed)
    if stop is not None:
        return Decision(Rung.STOP, stop)
    if f.batch_node is not None and f.batch_node in blamed and \
            f.cls == IncidentClass.NODE_LOST:
        return Decision(Rung.REQUEUE, f"the batch step's node {f.batch_node} is lost; Slurm "
                                      "ends the job with it, requeueing", blamed)
    if f.controller_node in blamed:
        return Decision(Rung.REQUEUE, f"the controller's node {f.controller_node} is blamed "
                                      f"({f.cls}); requeueing the job", blamed)
    if blamed and len(blamed) > f.spares_left:
        return Decision(Rung.REQUEUE, f"{len(blamed)} node(s) blamed ({', '.join(blamed)}) "
                                      f"but {f.spares_left} spare(s) left", blamed)
    if blamed:
        return Decision(Rung.SPARE, f"node(s) {', '.join(blamed)} blamed ({f.cls}); "
                                    "activating spare(s)", blamed)
    return Decision(Rung.IN_PLACE, f"{f.cls}: restarting in place from the latest snapshot")


def time_limit_rung(f: Facts) -> Decision:
    """Slurm's warning before the time limit: requeue, whatever the restart budget (a
    long run is a chain of allocations); stop when a whole allocation finished no step
    since the previous one's warning, since the next would do no better."""
    if f.time_limit_stalled:
        return Decision(Rung.STOP, "the time limit came again with no step finished since "
                                   "the previous allocation's: the run makes no progress "
                                   "within one allocation; ask for a longer --time (or a "
                                   "faster start) and resubmit")
    return Decision(Rung.REQUEUE, "the allocation's time limit is near: requeueing the job "
                                  "to go on from its newest step")


def outage_rung(f: Facts) -> Decision:
    """An external service down at start-up (outage.py): no node is blamed and neither
    the no-progress nor the restart budget counts it. In place after a backoff while the
    outage is within its budget; a stop naming the service once it has lasted longer."""
    if f.outage_s >= f.outage_budget_s:
        return Decision(Rung.STOP, outage_verdict(f.cls, f.outage_s, f.outage_failures,
                                                  f.outage_budget_s, f.outage_service))
    delay = backoff_s(f.outage_failures, f.outage_backoff_s, f.outage_backoff_max_s)
    return Decision(Rung.IN_PLACE, f"{f.cls} at start-up ({f.outage_service or 'service'}"
                                   f"): restarting in place in {delay:g} s (outage "
                                   f"attempt {f.outage_failures}, {f.outage_s:.0f} s of "
                                   f"{f.outage_budget_s:.0f} s)", delay_s=delay)


def with_nan_advice(d: Decision, f: Facts) -> Decision:
    """The NaN ladder's call replaces an in-place restart (a budget that stops wins)."""
    if f.nan_advice is not None and d.rung is Rung.IN_PLACE:
        return f.nan_advice
    return d


def with_evict_reason(d: Decision, f: Facts) -> Decision:
    """The evidence that named the nodes (a monitor finding, a replay) joins the reason."""
    if f.evict_reason:
        return dataclasses.replace(d, reason=f"{d.reason}; {f.evict_reason}")
    return d


def with_rollback(d: Decision, f: Facts) -> Decision:
    """A hot update's own failure rolls it back: a stop becomes an in-place restart on the
    previous version."""
    if f.rollback is not None and d.rung == Rung.STOP:
        return dataclasses.replace(d, rung=Rung.IN_PLACE, evict=(),
                                   reason=f"{d.reason}; {f.rollback}")
    return d


def with_diagnosis_reason(d: Decision, f: Facts) -> Decision:
    """The verdict names what the node's own checks found, not just the class."""
    if f.diagnosis_reason and d.evict:
        return dataclasses.replace(d, reason=f"{d.reason}; {f.diagnosis_reason}")
    return d


def capped(decision: Decision, blamed_before: Collection[str], limit: int) -> Decision:
    """``decision`` unchanged, or a STOP when its evictions would take the run over
    ``limit`` blamed nodes in all (each blamed node is drained and replaced)."""
    total = set(blamed_before) | set(decision.evict)
    if not decision.evict or len(total) <= limit:
        return decision
    return Decision(Rung.STOP, f"blame cap: this fault would make {len(total)} blamed "
                               f"node(s) in this run ({', '.join(sorted(total))}), over "
                               f"max_blamed_nodes={limit}; stopping instead of draining "
                               "more (an admin should look at the job and these nodes)")
