"""Honest incident accounting: overlapping incidents and ordered times.

An incident is *cut short* when a second fault comes before the first step after its
recovery. Both are kept: the earlier one rides inside the later one (``cut_short``;
``_cut_short`` in ``state.json``, persisted with the open incident across a requeue;
never written itself) until the run recovers from both at once; then each is written
with the same ``recovered_at``, and ``evidence.overlap`` says how they overlapped. Steps
lost are counted once: the earlier incident loses ``last_step - restored_step``, the
later one only the steps finished after the earlier one's last step.

Times: the fault time comes from a worker's clock, the others from the controller's; a
worker whose clock runs ahead would make ``detected_at - fault_time`` negative. Every
written incident has ``fault_time <= detected_at <= localized_at <= recovered_at`` (a
clamped fault time is noted in ``evidence.clock_skew_s``).
"""

from __future__ import annotations

from slurm_robust.launcher.messages import Incident


def cut_short(earlier: Incident, later: Incident, now: float) -> None:
    """Record that ``later`` happened while ``earlier`` was still being recovered."""
    how = (f"{later.cls} at {now:.3f}, {max(now - earlier.detected_at, 0.0):.3f} s "
           f"after {earlier.incident} ({earlier.cls}) was detected, before the "
           "first step after its recovery")
    earlier.evidence["overlap"] = {"cut_short_by": later.incident, "at": now, "how": how}
    later.evidence["overlap"] = {"cut_short": earlier.incident, "at": now, "how": how}
    # Flatten: a chain of cut-short incidents all settle with the last one.
    chain = [*earlier.cut_short, earlier]
    earlier.cut_short = []
    later.cut_short = [*later.cut_short, *chain]


def settle(incident: Incident) -> list[Incident]:
    """The incidents ``incident`` cut short, completed from its outcome (to be written
    before it); adjusts ``incident``'s own ``steps_lost`` so no step is counted twice."""
    cut, incident.cut_short = incident.cut_short, []
    if not cut:
        return []
    restored = incident.restored_step
    lost = incident.steps_lost
    for c in cut:
        c.recovered_at = incident.recovered_at
        if restored is not None or c.restored_step is None:
            c.restored_step, c.restore_tier = restored, incident.restore_tier
        # else: the later incident never restored (it stopped the run); the earlier one's
        # own restore, recorded when it was cut short, is what happened.
        c.rung = c.rung or incident.rung
        c.steps_lost = None if lost is None else max(
            0, (c.last_step or 0) - (c.restored_step or 0))
    if lost is not None:
        before = max([(c.last_step or 0) for c in cut] + [restored or 0])
        incident.steps_lost = max(0, (incident.last_step or 0) - before)
    return cut


def ordered_times(incident: Incident) -> Incident:
    """``incident`` with fault <= detected <= localized <= recovered (in place)."""
    detected = incident.detected_at
    fault = incident.fault_time
    if fault is not None and fault > detected:
        incident.evidence["clock_skew_s"] = round(fault - detected, 6)
        incident.fault_time = detected
    if incident.localized_at is not None:
        incident.localized_at = max(incident.localized_at, detected)
    floor = incident.localized_at if incident.localized_at is not None else detected
    if incident.recovered_at is not None:
        incident.recovered_at = max(incident.recovered_at, floor)
    return incident
