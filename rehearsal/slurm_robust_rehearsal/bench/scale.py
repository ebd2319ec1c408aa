"""``slurm-robust bench scale``: the controller's control plane against N simulated agents.

The real controller (control/controller.py: the class, its TCP server and tick loop, as
``run_agent`` starts it, open-file limit raised first) runs in its own process on a
temporary run directory. N simulated agents (scale_agents.py), spread over a few
harness processes, speak the project's wire protocol to it: the HMAC handshake, typed
reports every heartbeat with one progress line per rank per step, replies read as plans,
pushed plans applied. Once every agent holds an active plan the steady window starts;
after ``--seconds`` one worker of the last agent crashes (a class the ladder restarts in
place), and the bench measures how fast the decision comes and reaches every agent.

Printed: the controller's CPU (cores, and ms per report served, from /proc of its pid),
RSS, threads and descriptors; report round trips (p50/p99/max) in the steady window and
during the recovery; reports served against offered (N / heartbeat); agents the
controller declared lost (its log) or told they were (an evicted/hold/exit plan); for
the failure, failure -> decision (from the report carrying the crash leaving its
simulated agent until the first agent holds the new generation's plan: an upper bound on
the controller's own decision time) and decision -> each agent holding
it (p50/p99/max); the harness's own CPU. Targets (TARGETS) are judged at any N; they are
the ones that must hold at 1,024 agents.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from slurm_robust.errors import SlurmRobustError
from slurm_robust_rehearsal.bench import scale_stress
from slurm_robust_rehearsal.bench.polling import wait_for

HELP = "controller CPU, report round trips and failure fan-out against N simulated agents"
KEY = "bench.0.0"
#: What must hold (at 1,024 agents, heartbeat 0.2 s, 8 ranks per node).
TARGETS = {"controller_cores": 1.0, "agents_lost": 0, "failure_to_decision_s": 1.0,
           "plan_fanout_p99_s": 1.0, "rtt_p99_ms": 250.0}
#: Agents one harness process drives at most before another process is added.
AGENTS_PER_PROC = 512


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agents", type=int, default=64, help="simulated agents (64)")
    parser.add_argument("--ranks-per-node", type=int, default=8, help="ranks per agent (8)")
    parser.add_argument("--step-s", type=float, default=1.0, help="training step time (1 s)")
    parser.add_argument("--heartbeat-s", type=float, default=0.2,
                        help="agents' report interval (0.2 s, the launcher's default)")
    parser.add_argument("--heartbeat-timeout-s", type=float, default=4.0,
                        help="controller's heartbeat timeout (4 s, the default)")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="steady window before the injected failure (20 s)")
    parser.add_argument("--recover-s", type=float, default=10.0,
                        help="window after the failure (10 s)")
    parser.add_argument("--procs", type=int, default=0,
                        help="harness processes (0: one per 512 agents, at most the "
                             "cores but one)")
    scale_stress.add_arguments(parser)


# ---------------------------------------------------------------------- the controller
def controller_main(run_dir: str, nodes: int, rpn: int, hb: float, hbt: float,
                    stall_s: float = 0.0) -> None:
    """The controller process: what run_agent does for the controller's part (and a
    stalled tick on the parent's signal, scale_stress.py)."""
    from slurm_robust.launcher.config import RunConfig
    from slurm_robust.launcher.control.controller import Controller
    from slurm_robust.launcher.identity import Identity
    from slurm_robust.launcher.limits import raise_nofile_limit

    logging.basicConfig(level=logging.INFO,
                        format="%(created).3f %(name)s %(levelname)s %(message)s")
    raise_nofile_limit()
    cfg = RunConfig(command=(sys.executable, "-c", "pass"), run_dir=run_dir, nodes=nodes,
                    spares=0, workers_per_node=rpn, heartbeat_s=hb, heartbeat_timeout_s=hbt,
                    startup_timeout_s=1800.0)
    ident = Identity(index=0, node="n0", job_id="bench", step_key=KEY, restart_count=0)
    ctl = Controller(cfg, ident)
    scale_stress.arm_stall(ctl, stall_s)
    ctl.start()
    scale_stress.wait_for(ctl)


# ---------------------------------------------------------------------- /proc
def proc_sample(pid: int) -> dict[str, float] | None:
    """CPU seconds, RSS, threads and descriptors of ``pid`` (None: it has exited)."""
    try:
        return _proc_sample(pid)
    except (OSError, KeyError, ValueError, IndexError):
        return None


def _proc_sample(pid: int) -> dict[str, float]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    status = Path(f"/proc/{pid}/status").read_text()
    vals = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"t": time.time(), "cpu_s": cpu,
            "rss_mib": int(vals["VmRSS"].split()[0]) / 1024,
            "threads": int(vals["Threads"]), "fds": len(os.listdir(f"/proc/{pid}/fd"))}


class Sampler:
    """The controller's /proc figures once a second: the last sample, the peaks, and
    when it exited (the run ended, e.g. a requeue after agents were declared lost)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.last: dict[str, float] | None = None
        self.peaks: dict[str, float] = {}
        self.exited_at: float | None = None

    def sample(self) -> dict[str, float] | None:
        s = proc_sample(self.pid) if self.exited_at is None else None
        if s is None:
            self.exited_at = self.exited_at or time.time()
            return self.last
        self.last = s
        self.peaks = {k: max(self.peaks.get(k, v), v) for k, v in s.items()}
        return s

    def until(self, t: float) -> None:
        while time.time() < t:
            time.sleep(min(1.0, max(t - time.time(), 0.0)))
            self.sample()


def listen_overflows() -> int | None:
    """TcpExt ListenOverflows of this host (all sockets: a delta is only a hint)."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            row = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return int(row.get("ListenOverflows", 0))
    return None


# ---------------------------------------------------------------------- statistics
def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def _dist(values: list[float], scale: float, digits: int) -> dict[str, Any]:
    def r(v: float | None) -> float | None:
        return None if v is None else round(v * scale, digits)
    return {"n": len(values), "p50": r(pct(values, 50)), "p99": r(pct(values, 99)),
            "max": r(max(values) if values else None)}


_LOST = re.compile(r"agent (\d+) on \S+ lost \(")
#: A push round the controller's report loop logged (report_loop.PUSHED_LINE).
_PUSHED = re.compile(r"control\.report_loop INFO pushed (\d+) plans in ([\d.]+) s")


def lost_in_log(log_path: Path, until: float) -> dict[str, str]:
    """Agents the controller's log declares lost by ``until``: index -> the line."""
    out: dict[str, str] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        head, _, rest = line.partition(" ")
        try:
            t = float(head)
        except ValueError:
            continue
        m = _LOST.search(rest)
        if t <= until and m:
            out.setdefault(m.group(1), rest.split(" ", 2)[-1])
    return out


def pushes_in_log(log_path: Path, since: float) -> list[tuple[float, int, float]]:
    """The controller's logged push rounds (report_loop.PUSHED_LINE) from ``since``: (when
    the last push of the round was written, plans, seconds the round took)."""
    out = []
    for line in log_path.read_text(errors="replace").splitlines():
        head, _, rest = line.partition(" ")
        m = _PUSHED.search(rest)
        if m is None:
            continue
        try:
            t = float(head)
        except ValueError:
            continue
        if t >= since:
            out.append((t, int(m.group(1)), float(m.group(2))))
    return out


# ---------------------------------------------------------------------- orchestration
def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}


def _readline(stream: IO[str], timeout: float, what: str) -> str:
    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            raise SlurmRobustError(f"timed out after {timeout:g} s waiting for {what}")
    finally:
        sel.close()
    line = stream.readline()
    if not line:
        raise SlurmRobustError(f"{what}: the harness process ended early")
    return line


def _procs(args: argparse.Namespace) -> int:
    if args.procs > 0:
        return min(args.procs, args.agents)
    cores = os.cpu_count() or 2
    return max(1, min(math.ceil(args.agents / AGENTS_PER_PROC), max(cores - 1, 1)))


def agent_cadence(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with the heartbeat and its timeout the launcher uses for this many
    agents (control/cadence.py scales them past a few hundred agents; a tree without
    that uses them as given), so the simulated agents report as real ones would."""
    from slurm_robust.launcher.config import RunConfig
    from slurm_robust.launcher.control import cadence

    beat, timeout = args.heartbeat_s, args.heartbeat_timeout_s
    if hasattr(cadence, "scaled"):
        cfg = cadence.scaled(RunConfig(command=("bench",), run_dir="/nonexistent",
                                       nodes=args.agents, spares=0, heartbeat_s=beat,
                                       heartbeat_timeout_s=timeout))
        beat, timeout = cfg.heartbeat_s, cfg.heartbeat_timeout_s
    return argparse.Namespace(**{**vars(args), "heartbeat_s": beat,
                                 "heartbeat_timeout_s": timeout,
                                 "asked_heartbeat_s": args.heartbeat_s})


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.agents < 2:
        raise SlurmRobustError("bench scale needs at least 2 agents (one of them fails)")
    args = agent_cadence(args)
    tmp = Path(tempfile.mkdtemp(prefix="scale-bench-"))
    run_dir = tmp / "run"
    ctl_log = tmp / "controller.log"
    harnesses: list[subprocess.Popen[str]] = []
    ctl: subprocess.Popen[bytes] | None = None
    stress: scale_stress.Stress | None = None
    try:
        with open(ctl_log, "wb") as log_f:
            ctl = subprocess.Popen(
                [sys.executable, "-m", "slurm_robust_rehearsal.bench.scale", "controller",
                 str(run_dir), str(args.agents), str(args.ranks_per_node),
                 str(args.heartbeat_s), str(args.heartbeat_timeout_s),
                 str(args.stall_tick_s)],
                stdout=subprocess.DEVNULL, stderr=log_f, env=_env())
        info_path = run_dir / "controller.json"

        def started() -> dict[str, Any] | None:
            if ctl is not None and ctl.poll() is not None:
                raise SlurmRobustError(f"the controller exited ({ctl.returncode}): "
                                       f"{ctl_log.read_text()[-800:]}")
            return json.loads(info_path.read_text()) if info_path.exists() else None

        info = wait_for(started, 60.0, "the controller's controller.json", every_s=0.05)
        overflows0 = listen_overflows()
        nprocs = _procs(args)
        share = math.ceil(args.agents / nprocs)
        for p in range(nprocs):
            first = p * share
            count = min(share, args.agents - first)
            if count <= 0:
                break
            harnesses.append(subprocess.Popen(
                [sys.executable, "-m", "slurm_robust_rehearsal.bench.scale_agents",
                 str(info["host"]), str(info["port"]), str(run_dir), KEY, str(first),
                 str(count), str(args.heartbeat_s), str(args.step_s),
                 str(args.agents - 1),
                 str(args.agent_timeout_s or args.heartbeat_timeout_s)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env()))
        t_connect = time.time()
        for h in harnesses:
            assert h.stdout is not None
            _readline(h.stdout, 120.0 + 0.2 * args.agents, "every agent's first active plan")
        all_active_s = time.time() - t_connect
        window_start = time.time() + 0.5
        fail_at = window_start + args.seconds
        end = fail_at + args.recover_s
        for h in harnesses:
            assert h.stdin is not None
            h.stdin.write(f"GO {window_start} {fail_at} {end}\n")
            h.stdin.flush()
        time.sleep(max(window_start - time.time(), 0.0))
        stress = scale_stress.Stress(args, ctl.pid)
        stress.start(window_start, fail_at)
        sampler = Sampler(ctl.pid)
        s0 = sampler.sample()
        sampler.until(fail_at)
        s1 = sampler.last
        stress.stop()
        sampler.until(end)
        s2 = sampler.last
        results = []
        for h in harnesses:
            assert h.stdout is not None
            results.append(json.loads(_readline(h.stdout, 60.0, "a harness's result")))
        lost = lost_in_log(ctl_log, end)
        if s0 is None or s1 is None or s2 is None or s1["t"] - s0["t"] < 0.5:
            # The run ended before the window (agents declared lost, a requeue): that
            # is the finding; there is no steady state to measure.
            return {"agents": args.agents, "error": "the controller ended the run before "
                    "the steady window", "agents_lost": len(lost),
                    "lost_in_log": dict(list(lost.items())[:20]),
                    "controller_log_end": ctl_log.read_text()[-600:],
                    "harness": _harness(results), "all_targets_met": False,
                    "stress": stress.summary(run_dir, ctl_log, window_start)}
        peaks = sampler.peaks
        overflows1 = listen_overflows()
        out = summarize(args, results, s0, s1, s2, peaks, lost, window_start, fail_at, end,
                        all_active_s, nprocs,
                        None if overflows0 is None or overflows1 is None
                        else overflows1 - overflows0,
                        controller_exited=sampler.exited_at,
                        pushes=pushes_in_log(ctl_log, fail_at))
        out["stress"] = stress.summary(run_dir, ctl_log, window_start)
        return out
    except Exception:
        # What the controller said is what explains most failures of the bench.
        if ctl_log.exists():
            sys.stderr.write("controller log (end):\n" + ctl_log.read_text()[-3000:])
        raise
    finally:
        if stress is not None:
            stress.stop()
        if ctl is not None and ctl.poll() is None:
            ctl.send_signal(signal.SIGKILL)
            ctl.wait()
        for h in harnesses:
            if h.stdin is not None:
                try:
                    h.stdin.close()
                except OSError:
                    pass
            try:
                h.wait(timeout=10)
            except subprocess.TimeoutExpired:
                h.kill()
                h.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _harness(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The harness's own load: when it lags, the controller sees late heartbeats."""
    return {"cpu_cores": round(sum(r["cpu_s"] for r in results)
                               / max(max(r["wall_s"] for r in results), 1e-9), 3),
            "connect_retries": sum(r["connect_failures"] for r in results),
            "send_lag_p99_ms": max(r["lag_p99_ms"] for r in results),
            "send_lag_max_ms": max(r["lag_max_ms"] for r in results),
            "pushes": sum(r["pushes"] for r in results),
            # The largest harness process's peak RSS (None: a harness without the field).
            "rss_mib_max": max((r.get("rss_mib_max") or 0 for r in results), default=0)
            or None,
            # Agents that gave up waiting for an answer and reconnected (--agent-timeout-s).
            "gave_up": sum(r.get("gave_up", 0) for r in results),
            # Mean bytes per reply (the plan in full or "unchanged"), whole run.
            "reply_bytes_mean": round(sum(r["reply_bytes"] for r in results)
                                      / max(sum(r["replies"] for r in results), 1))}


def summarize(args: argparse.Namespace, results: list[dict[str, Any]],
              s0: dict[str, float], s1: dict[str, float], s2: dict[str, float],
              peaks: dict[str, float], lost: dict[str, str], window_start: float,
              fail_at: float,
              end: float, all_active_s: float, nprocs: int,
              overflows: int | None, controller_exited: float | None = None,
              pushes: list[tuple[float, int, float]] | None = None) -> dict[str, Any]:
    steady = [r for res in results for s, r in res["rtts"] if window_start <= s < fail_at]
    recov = [r for res in results for s, r in res["rtts"] if fail_at <= s < end]
    served = len(steady)
    window = fail_at - window_start
    steady_cpu = s1["cpu_s"] - s0["cpu_s"]
    cores = steady_cpu / (s1["t"] - s0["t"])
    recov_cores = (s2["cpu_s"] - s1["cpu_s"]) / max(s2["t"] - s1["t"], 1e-9)
    fail_sent = next((r["fail_sent_at"] for r in results if r["fail_sent_at"]), None)
    fail_gen = next((r["fail_gen"] for r in results if r["fail_gen"] is not None), None)
    got: list[float] = []
    missing = 0
    for res in results:
        for gens in res["gens"].values():
            later = [t for g, t in gens.items() if fail_gen is not None and int(g) > fail_gen]
            if later:
                got.append(min(later))
            else:
                missing += 1
    decided = min(got) if got else None
    to_decision = decided - fail_sent if decided is not None and fail_sent else None
    fanout = [t - decided for t in got] if decided is not None else []
    # The decision's push round: when its last plan left the controller, from the first
    # agent holding it (the controller's share of the fan-out; the rest is the harness).
    # It is the last round that ended before the last agent held the plan (a run of up
    # to 300 agents also pushes the hurry, before it).
    last_got = max(got) if got else None
    rounds = [p for p in pushes or [] if (fail_sent is None or p[0] >= fail_sent)
              and last_got is not None and p[0] <= last_got][-1:]
    pushed = None if not rounds or decided is None else {
        "plans": rounds[0][1], "write_s": round(rounds[0][2], 3),
        "last_written_after_decision_s": round(rounds[0][0] - decided, 3)}
    lost_plans = {k: v for res in results for k, v in res["lost_plans"].items()}
    fan = _dist(fanout, 1.0, 3)
    rtt = _dist(steady, 1000.0, 1)
    agents_lost = len(set(lost) | set(lost_plans))
    numbers = {
        "controller_cores": round(cores, 3),
        "agents_lost": agents_lost,
        "failure_to_decision_s": None if to_decision is None else round(to_decision, 3),
        "plan_fanout_p99_s": fan["p99"] if not missing else None,
        "rtt_p99_ms": rtt["p99"],
    }
    targets = {}
    for name, limit in TARGETS.items():
        value = numbers[name]
        targets[name] = {"value": value, "target": limit,
                         "met": value is not None and value <= limit}
    return {
        "agents": args.agents, "ranks_per_node": args.ranks_per_node,
        "heartbeat_s": args.heartbeat_s, "step_s": args.step_s,
        "asked_heartbeat_s": getattr(args, "asked_heartbeat_s", args.heartbeat_s),
        "heartbeat_timeout_s": args.heartbeat_timeout_s,
        "seconds": args.seconds, "harness_procs": nprocs,
        "all_active_s": round(all_active_s, 2),
        "controller": {
            "cores": round(cores, 3), "cores_during_recovery": round(recov_cores, 3),
            "cpu_ms_per_report": round(steady_cpu / served * 1000, 3) if served else None,
            "rss_mib": round(s1["rss_mib"], 1), "rss_mib_peak": round(peaks["rss_mib"], 1),
            "threads": int(s1["threads"]), "threads_peak": int(peaks["threads"]),
            "fds": int(s1["fds"]), "fds_peak": int(peaks["fds"])},
        "rtt_ms": rtt,
        "rtt_ms_during_recovery": _dist(recov, 1000.0, 1),
        "reports": {"served_per_s": round(served / window, 1),
                    "offered_per_s": round(args.agents / args.heartbeat_s, 1),
                    "served": served},
        "agents_lost": agents_lost, "lost_in_log": dict(list(lost.items())[:20]),
        "lost_plans": dict(list(lost_plans.items())[:20]),
        "failure": {"failed_gen": fail_gen,
                    "failure_to_decision_s": numbers["failure_to_decision_s"],
                    "decided": decided is not None,
                    "fanout_s": fan, "agents_without_new_plan": missing,
                    "decision_push": pushed},
        "harness": _harness(results),
        "listen_overflows_host": overflows,
        "controller_exited_s": None if controller_exited is None
        else round(controller_exited - window_start, 2),
        "agents_closed": sum(r["closed"] for r in results),
        "targets": targets,
        "all_targets_met": all(t["met"] for t in targets.values()),
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["controller"]:
        d, n, rpn, hb, hbt, stall = sys.argv[2:8]
        controller_main(d, int(n), int(rpn), float(hb), float(hbt), float(stall))
    else:
        raise SystemExit("usage: python -m slurm_robust_rehearsal.bench.scale controller "
                         "RUN_DIR NODES RANKS_PER_NODE HEARTBEAT_S HEARTBEAT_TIMEOUT_S "
                         "STALL_TICK_S")
