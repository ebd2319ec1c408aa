"""Honest incident accounting: overlapping incidents and ordered times.

An incident is *cut short* when a second fault comes before the first step after its
recovery. Both are kept: the earlier one rides inside the later one (``_cut_short``,
never written itself, persisted with the open incident across a requeue) until the run
recovers from both at once; then each is written with the same ``recovered_at``, and
``evidence.overlap`` says how they overlapped. Steps lost are counted once: the earlier
incident loses ``last_step - restored_step``, the later one only the steps finished
after the earlier one's last step.

Times: the fault time comes from a worker's clock, the others from the controller's; a
worker whose clock runs ahead would make ``detected_at - fault_time`` negative. Every
written incident has ``fault_time <= detected_at <= localized_at <= recovered_at`` (a
clamped fault time is noted in ``evidence.clock_skew_s``).
"""

from __future__ import annotations

from typing import Any

CUT_KEY = "_cut_short"


def cut_short(earlier: dict[str, Any], later: dict[str, Any], now: float) -> None:
    """Record that ``later`` happened while ``earlier`` was still being recovered."""
    how = (f"{later['class']} at {now:.3f}, {max(now - earlier['detected_at'], 0.0):.3f} s "
           f"after {earlier['incident']} ({earlier['class']}) was detected, before the "
           "first step after its recovery")
    earlier["evidence"]["overlap"] = {"cut_short_by": later["incident"], "at": now,
                                      "how": how}
    later["evidence"]["overlap"] = {"cut_short": earlier["incident"], "at": now, "how": how}
    # Flatten: a chain of cut-short incidents all settle with the last one.
    chain = [*earlier.pop(CUT_KEY, []), earlier]
    later[CUT_KEY] = [*later.get(CUT_KEY, []), *chain]


def settle(incident: dict[str, Any]) -> list[dict[str, Any]]:
    """The incidents ``incident`` cut short, completed from its outcome (to be written
    before it); adjusts ``incident``'s own ``steps_lost`` so no step is counted twice."""
    cut: list[dict[str, Any]] = incident.pop(CUT_KEY, [])
    if not cut:
        return []
    restored = incident.get("restored_step")
    lost = incident.get("steps_lost")
    for c in cut:
        c["recovered_at"] = incident.get("recovered_at")
        if restored is not None or c.get("restored_step") is None:
            c.update(restored_step=restored, restore_tier=incident.get("restore_tier"))
        # else: the later incident never restored (it stopped the run); the earlier one's
        # own restore, recorded when it was cut short, is what happened.
        c["rung"] = c.get("rung") or incident.get("rung")
        c["steps_lost"] = None if lost is None else max(
            0, (c.get("last_step") or 0) - (c.get("restored_step") or 0))
    if lost is not None:
        before = max([(c.get("last_step") or 0) for c in cut] + [restored or 0])
        incident["steps_lost"] = max(0, (incident.get("last_step") or 0) - before)
    return cut


def ordered_times(incident: dict[str, Any]) -> dict[str, Any]:
    """``incident`` with fault <= detected <= localized <= recovered (in place)."""
    detected = incident.get("detected_at")
    fault = incident.get("fault_time")
    if detected is None:
        return incident
    if fault is not None and fault > detected:
        incident["evidence"]["clock_skew_s"] = round(fault - detected, 6)
        incident["fault_time"] = detected
    floor = detected
    for key in ("localized_at", "recovered_at"):
        if incident.get(key) is not None:
            incident[key] = max(incident[key], floor)
            floor = incident[key]
    return incident
