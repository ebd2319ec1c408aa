"""The hurried report interval (a failure settling) grows with the agents, so that the
reports all of them are asked for stay within what a controller serves."""

from __future__ import annotations

from slurm_robust.launcher.control.cadence import (
    HURRY_POLL_S,
    HURRY_REPORTS_PER_S,
    hurry_poll_s,
)


def test_hurried_polls_stay_within_what_a_controller_serves():
    assert hurry_poll_s(2, 0.2) == HURRY_POLL_S  # a small run hurries as before
    for agents in (256, 1024, 4096):
        poll = hurry_poll_s(agents, 5.0)
        assert agents / poll <= HURRY_REPORTS_PER_S + 1e-6
    assert hurry_poll_s(4096, 0.2) == 0.2  # never slower than the heartbeat
