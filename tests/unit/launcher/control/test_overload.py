"""The controller's lateness (control/overload.py): measured, recorded, and not counted
against the agents; a dead agent is still lost within the heartbeat timeout."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import pytest

from slurm_robust.launcher.auth import client_handshake
from slurm_robust.launcher.control import overload
from slurm_robust.launcher.control.controller import RECONNECT_GRACE_S, Controller
from slurm_robust.launcher.control.events import EventLog
from slurm_robust.launcher.control.overload import (
    ALLOWANCE_S,
    EPISODE_S,
    Lateness,
    OverloadRecorder,
)
from slurm_robust.launcher.messages import Reply
from slurm_robust.launcher.protocol import Channel
from tests.unit.launcher.control.controller_helpers import stall_tick_once, wait_running

T0 = 1_000_000.0


def _beats(late: Lateness, times: list[float]) -> list[float]:
    return [late.beat(T0 + t) for t in times]


def test_a_loop_on_its_pace_is_never_late():
    late = Lateness(T0)
    assert _beats(late, [0.05 * i for i in range(1, 200)]) == [0.0] * 199
    assert late.elapsed(T0, T0 + 9.95) == pytest.approx(9.95)


def test_a_stalled_tick_is_taken_off_the_responsive_time():
    late = Lateness(T0)
    _beats(late, [0.05, 0.1])
    assert late.beat(T0 + 6.1) == pytest.approx(6.0 - ALLOWANCE_S)  # a 6 s tick
    _beats(late, [6.15, 6.2])
    # An agent last heard just before the stall: 6.1 s of wall time, 0.35 s responsive
    # (the allowance of the stalled gap, then 0.1 s on pace).
    assert late.elapsed(T0 + 0.1, T0 + 6.2) == pytest.approx(ALLOWANCE_S + 0.1)
    # Before and after the stall the clocks agree.
    assert late.elapsed(T0, T0 + 0.1) == pytest.approx(0.1)
    assert late.elapsed(T0 + 6.1, T0 + 6.2) == pytest.approx(0.1)
    # Part of the late interval: only the part inside counts.
    assert late.late_between(T0 + 1.0, T0 + 2.0) == pytest.approx(1.0)


def test_the_stall_in_progress_counts_already():
    late = Lateness(T0)
    late.beat(T0 + 0.05)
    # No tick since T0 + 0.05: the loop is late now, not only once it ticks again.
    assert late.late_between(T0, T0 + 5.05) == pytest.approx(5.0 - ALLOWANCE_S)
    assert late.elapsed(T0, T0 + 5.05) == pytest.approx(0.05 + ALLOWANCE_S)


def test_old_lateness_is_pruned_and_recent_judgments_stay_exact():
    late = Lateness(T0)
    t = 0.0
    for _ in range(overload.KEEP + 10):
        t += 1.0 + ALLOWANCE_S  # each gap 1 s late
        late.beat(T0 + t)
    assert len(late._starts) <= overload.KEEP
    assert late.late_between(T0 + t - 3 * (1.0 + ALLOWANCE_S), T0 + t) == pytest.approx(3.0)


def test_overload_is_logged_recorded_and_metered_at_most_every_period(caplog):
    events: list[tuple[dict, float]] = []
    lags: list[tuple[float, bool]] = []
    rec = OverloadRecorder(lambda f, now: events.append((f, now)),
                           lambda lag, ep: lags.append((lag, ep)))
    with caplog.at_level(logging.WARNING, "slurm_robust.launcher.control.controller"):
        rec.note(0.0, T0, 64)
        rec.note(0.3, T0 + 1, 64)  # late, not an episode
        assert events == [] and lags == [(0.3, False)]
        rec.note(5.0, T0 + 10, 64)  # an episode: recorded at once
        rec.note(2.0, T0 + 12, 64)  # within the period: held
        rec.note(0.0, T0 + 15, 64)
        assert len(events) == 1
        rec.note(0.0, T0 + 20.5, 64)  # the period is over: the held one goes out
    assert [e[0]["lag_s"] for e in events] == [5.0, 2.0]
    first = events[0][0]
    assert first == {"overload_version": 1, "lag_s": 5.0, "episodes": 1, "late_s": 5.0,
                     "since": T0 + 5, "agents": 64}
    assert rec.episodes == 2 and rec.worst == 5.0
    assert sum(1 for r in caplog.records if "controller overloaded" in r.message) == 2
    assert lags[-1] == (2.0, True) or lags[-2] == (2.0, True)


def test_an_episode_held_by_the_period_is_recorded_before_the_run_ends(tmp_path):
    # A slow start is recorded at once; a worse stall within the next 10 s is held by the
    # period, and the run ends before it is over: the held one must reach the event log
    # ahead of run_end, not vanish with the process.
    log = EventLog(tmp_path / "events.jsonl", "r1", "7")
    rec = OverloadRecorder(log.controller_overload)
    log.before_end.append(lambda now: rec.flush(now, 8))
    rec.note(1.1, T0, 8)
    rec.note(1.8, T0 + 3, 8)
    log.run_end("completed", 10, None, None)
    records = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text()
               .splitlines()]
    assert [r["event"] for r in records] == ["controller_overload", "controller_overload",
                                             "run_end"]
    assert [r["lag_s"] for r in records[:2]] == [1.1, 1.8]
    rec.flush(T0 + 4, 8)  # nothing held: nothing written
    assert len((tmp_path / "events.jsonl").read_text().splitlines()) == 3


# ---------------------------------------------------------------------- a real controller
def _agent(ctl: Controller, index: int, silent: threading.Event, close: threading.Event,
           stop: threading.Event, last: dict[int, float]) -> None:
    """An agent on a real socket: reports every 0.1 s until ``silent`` (then sends nothing
    but keeps its connection) or ``close`` (its process died: the kernel closes it)."""
    info = json.loads(ctl.paths.controller.read_text())
    chan = Channel.connect(info["host"], info["port"], 30.0)
    client_handshake(chan, ctl.secret)
    gen = -1
    while not stop.is_set():
        if close.is_set():
            chan.sock.shutdown(socket.SHUT_RDWR)
            chan.close()
            return
        if not silent.is_set():
            report = {"op": "report", "key": ctl.ident.step_key, "agent": index,
                      "node": f"n{index + 1}", "pid": 100 + index, "gen": gen,
                      "time": time.time(), "exits": [], "progress": [], "states": {},
                      "stacks": {}}
            plan = Reply.from_json(chan.request(report)).plan
            last[index] = time.time()
            gen = plan.gen if plan is not None and plan.gen is not None else gen
        time.sleep(0.1)
    chan.close()


@pytest.mark.parametrize("how", ["silent", "closed"])
def test_a_dead_agent_is_still_lost_within_the_timeout_on_a_healthy_controller(
        start_controller, how):
    hbt = 1.0
    ctl = start_controller(hbt)
    stop = threading.Event()
    silent, close = threading.Event(), threading.Event()
    last: dict[int, float] = {}
    threads = [threading.Thread(target=_agent,
                                args=(ctl, i, silent if i == 1 else threading.Event(),
                                      close if i == 1 else threading.Event(), stop, last),
                                daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    try:
        wait_running(ctl)
        time.sleep(0.5)
        (silent if how == "silent" else close).set()
        died = time.time()
        view = ctl.agents[1]
        while not view.lost and time.time() < died + 10:
            time.sleep(0.01)
        noticed = time.time()
        assert view.lost, "a dead agent was never declared lost"
        assert not ctl.agents[0].lost
        # Within the timeout of responsive time: the wall time less the controller's own
        # lateness (none on a healthy controller, some on a loaded test machine).
        limit = hbt if how == "silent" else RECONNECT_GRACE_S
        took = ctl.lateness.elapsed(last[1] if how == "silent" else died, noticed)
        assert took <= limit + 0.5, (took, limit)
        if how == "silent":
            # Not early either (the agent's own stamp follows the controller's by its
            # reply's trip, which a loaded machine stretches).
            assert took > limit - 0.5, "declared lost before the timeout"
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)


def test_a_stalled_tick_blames_no_agent_and_records_the_overload(start_controller,
                                                                  monkeypatch, caplog):
    # Agents on real sockets; one tick holds the lock for 4 heartbeat timeouts.
    hbt, stall = 1.0, 4.0
    ctl = start_controller(hbt)
    stop = threading.Event()
    last: dict[int, float] = {}
    threads = [threading.Thread(target=_agent, args=(ctl, i, threading.Event(),
                                                     threading.Event(), stop, last),
                                daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    try:
        wait_running(ctl)
        time.sleep(0.3)
        stalled = stall_tick_once(monkeypatch, ctl, stall)
        with caplog.at_level(logging.WARNING, "slurm_robust.launcher.control.controller"):
            while not stalled.is_set():
                time.sleep(0.01)
            time.sleep(stall + 2 * hbt)
        assert not any(v.lost for v in ctl.agents.values()), \
            [(v.index, v.lost) for v in ctl.agents.values()]
        assert ctl.recovery.gen is not None and not ctl.recovery.gen.failures
        assert not [r for r in caplog.records if " lost (" in r.message]
        # Recorded: the log line, the event, the metrics.
        assert any("controller overloaded" in r.message for r in caplog.records)
        recs = [json.loads(line) for line in ctl.paths.events.read_text().splitlines()]
        # The stall's record (a loaded test machine may add its own, shorter lateness).
        ev = max((r for r in recs if r["event"] == "controller_overload"),
                 key=lambda r: r["lag_s"])
        assert ev["lag_s"] >= stall - 1.0 and ev["episodes"] >= 1
        assert ev["overload_version"] == 1 and ev["agents"] == 2
        assert not [r for r in recs if r["event"] == "incident"]
        sample = ctl.metrics.registry.get_sample_value
        ids = {"job_id": "1", "run_id": ctl.recovery.state.run_id}
        assert sample("slurm_robust_controller_overloads_total", ids) >= 1
        assert sample("slurm_robust_controller_late_seconds_total", ids) >= stall - 1.0
        assert sample("slurm_robust_controller_lag_max_seconds", ids) >= stall - 1.0
        assert ctl.overload.worst >= EPISODE_S
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
