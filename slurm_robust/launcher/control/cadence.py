"""How often agents report while a new generation is imminent (the recovery owner's
``plan_for`` asks for it): fast enough that each sees the next plan within a fraction
of a second, bounded so that a thousand agents do not flood the controller."""

from __future__ import annotations

#: Agents' report interval while a transition is imminent (see plan_for): 20 reports a
#: second per agent for the few tenths of a second a settle or a step boundary lasts.
HURRY_POLL_S = 0.05
#: The most reports a second all hurried agents together are asked for: at HURRY_POLL_S
#: 1,024 agents would send 20,480 a second, far more than a controller serves, and the
#: queue that built up delayed the very decision the hurry is for. The settle still
#: ends within SETTLE_S, and the new plan goes out by wake-up, not by the next poll.
HURRY_REPORTS_PER_S = 2000.0


def hurry_poll_s(agents: int, heartbeat_s: float) -> float:
    """The hurried report interval for ``agents`` agents: HURRY_POLL_S while they are
    few, longer as they grow (HURRY_REPORTS_PER_S in all), never above the heartbeat."""
    return min(max(HURRY_POLL_S, agents / HURRY_REPORTS_PER_S), max(heartbeat_s, HURRY_POLL_S))
