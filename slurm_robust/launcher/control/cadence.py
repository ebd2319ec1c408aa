"""How often agents report: the steady heartbeat, which grows with the number of agents
past a few hundred (:func:`scaled`), and the hurried poll while a transition is imminent
(the recovery owner's ``plan_for`` asks for it: a hot update waiting for its step
boundary, a failure settling in a run of up to a few hundred agents): fast enough that
the controller hears every agent within a fraction of a second, bounded so that a
thousand agents do not flood the controller."""

from __future__ import annotations

import dataclasses

from slurm_robust.launcher.config import RunConfig

#: Agents' report interval while a transition is imminent (see plan_for): 20 reports a
#: second per agent for the few tenths of a second a settle or a step boundary lasts.
HURRY_POLL_S = 0.05
#: The most reports a second all hurried agents together are asked for: at HURRY_POLL_S
#: 1,024 agents would send 20,480 a second, far more than a controller serves, and the
#: queue that built up delayed the very transition the hurry is for. The new plan goes
#: out by push, not by the next poll.
HURRY_REPORTS_PER_S = 2000.0


def hurry_poll_s(agents: int, heartbeat_s: float) -> float:
    """The hurried report interval for ``agents`` agents: HURRY_POLL_S while they are
    few, longer as they grow (HURRY_REPORTS_PER_S in all), never above the heartbeat."""
    return min(max(HURRY_POLL_S, agents / HURRY_REPORTS_PER_S), max(heartbeat_s, HURRY_POLL_S))


def settle_hurry_helps(agents: int, heartbeat_s: float, settle_s: float) -> bool:
    """Whether hurrying ``agents`` agents while a failure settles can end the settle
    before ``settle_s``: their hurried poll, once the hurry reaches them, must fit in the
    settle with room (half of it), and must be quicker than the heartbeat. Up to 300
    agents at the defaults (0.15 s for 300); past that the hurry only adds load."""
    poll = hurry_poll_s(agents, heartbeat_s)
    return poll <= settle_s / 2 and poll < heartbeat_s


#: The most steady reports a second all agents together are asked for. Past
#: STEADY_REPORTS_PER_S x heartbeat_s agents (200 at the default 0.2 s) the heartbeat
#: grows with the agents: 4,096 agents at 0.2 s would send 20,480 reports a second, and
#: a controller that serves one in 0.3 to 0.9 ms of CPU (bench scale) would need 6 to 18
#: cores for them.
#: What changes is only the silent beat: a worker's exit wakes its agent at once, a
#: changed plan is pushed to every agent, and a transition hurries them (hurry_poll_s).
STEADY_REPORTS_PER_S = 1000.0
#: The heartbeat timeout is at least this many heartbeats, so that a scaled heartbeat
#: does not leave a node one late report from being declared lost.
TIMEOUT_BEATS = 5.0


def steady_heartbeat_s(agents: int, heartbeat_s: float) -> float:
    """The report interval for ``agents`` agents: ``heartbeat_s`` while they are few,
    longer as they grow (STEADY_REPORTS_PER_S in all)."""
    return max(heartbeat_s, agents / STEADY_REPORTS_PER_S)


def scaled(cfg: RunConfig) -> RunConfig:
    """``cfg`` with the heartbeat and its timeout for the run's agents (nodes and spares):
    the heartbeat by steady_heartbeat_s, the timeout at least TIMEOUT_BEATS of it. The
    same on every agent and the controller (each derives it from the config). Applying
    it twice changes nothing."""
    beat = steady_heartbeat_s(cfg.total_nodes, cfg.heartbeat_s)
    timeout = max(cfg.heartbeat_timeout_s, TIMEOUT_BEATS * beat)
    if beat == cfg.heartbeat_s and timeout == cfg.heartbeat_timeout_s:
        return cfg
    return dataclasses.replace(cfg, heartbeat_s=beat, heartbeat_timeout_s=timeout)
