"""``slurm-robust simulate``: a fleet simulation with this project's own decision code.

Writes ``OUT/run/events.jsonl`` (the run schema, read by ``slurm-robust report OUT/run``),
``OUT/summary.json`` and ``OUT/summary.md``; with ``--sweep`` also ``OUT/sweep.json``,
``OUT/sweep.md`` and ``OUT/sweep.png``; with ``--paper-check`` ``OUT/paper_check.json``
and ``OUT/paper_check.md``. See docs/SIMULATOR.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from slurm_robust.errors import UsageError

HELP = "simulate a long job on a large fleet with the real ladder, reserve and detectors"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--machines", type=int, default=1200, help="job machines (%(default)s)")
    parser.add_argument("--gpus-per-machine", type=int, default=8,
                        help="GPUs per machine, for the record (%(default)s)")
    parser.add_argument("--days", type=float, default=90.0, help="simulated days (%(default)s)")
    parser.add_argument("--spares", default="auto", metavar="K|auto|unlimited",
                        help="in-job spares (default: auto, binomial P99)")
    parser.add_argument("--reserve", default="auto", metavar="auto|N",
                        help="reserve target (default: auto, the real sizing)")
    parser.add_argument("--pool", type=int, default=None,
                        help="idle machines besides the reserve (default: 2%% of machines, >= 8)")
    parser.add_argument("--failure-mix", default="byterobust", metavar="byterobust|FILE",
                        help="failure rates by class: ByteRobust's (default) or a JSON "
                             "file (docs/SIMULATOR.md)")
    parser.add_argument("--recovery-times", default="byterobust",
                        metavar="byterobust|measured|FILE",
                        help="measured: from runs/*/events.jsonl under --runs-dir")
    parser.add_argument("--runs-dir", default="runs", help="rehearsal runs for 'measured'")
    parser.add_argument("--max-restarts", type=int, default=None,
                        help="the launcher's restart budget (default: its own default)")
    parser.add_argument("--refill-spares", action="store_true",
                        help="refill in-job spares from the reserve (the paper's standby pool)")
    parser.add_argument("--hang-rule", choices=("phases", "single"), default="phases",
                        help="phases: the job declares its phases, hangs are detected by "
                             "the learned steps limit (default); single: a plain script's "
                             "max(floor, factor x median) rule")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--sweep", action="store_true",
                        help="also run the what-if sweeps (spares, requeue delay, rungs)")
    parser.add_argument("--sweep-seeds", type=int, default=3,
                        help="seeds averaged per sweep row (%(default)s)")
    parser.add_argument("--paper-check", action="store_true",
                        help="also compare with the paper's numbers (4 configurations x "
                             "--check-seeds seeds)")
    parser.add_argument("--check-seeds", type=int, default=5,
                        help="seeds averaged by --paper-check (%(default)s)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("-o", "--out", metavar="OUT", help="output directory")


def _int_or(text: str, words: dict[str, int | None], flag: str) -> int | None:
    if text in words:
        return words[text]
    try:
        value = int(text)
    except ValueError as exc:
        raise UsageError(f"{flag} {text!r}: give a number or one of {', '.join(words)}") from exc
    if value < 0:
        raise UsageError(f"{flag} must be >= 0, got {value}")
    return value


def build_config(args: argparse.Namespace) -> Any:
    from dataclasses import replace

    from slurm_robust.simulate.config import (
        byterobust_times,
        load_json,
        load_mix,
        times_from_json,
    )
    from slurm_robust.simulate.engine import SimConfig
    from slurm_robust.simulate.job import UNLIMITED, LadderLimits
    from slurm_robust.simulate.measured import measured_times

    if args.machines < 1 or not args.days > 0 or args.gpus_per_machine < 1:
        raise UsageError("--machines and --gpus-per-machine must be >= 1, --days > 0")
    base = byterobust_times(args.machines)
    if args.recovery_times == "measured":
        times = measured_times(args.runs_dir, base)
    elif args.recovery_times == "byterobust":
        times = base
    else:
        times = times_from_json(load_json(args.recovery_times, "recovery times"), base,
                                args.recovery_times)
    limits = LadderLimits()
    if args.max_restarts is not None:
        limits = replace(limits, max_restarts=args.max_restarts)
    return SimConfig(
        machines=args.machines, days=args.days, mix=load_mix(args.failure_mix), times=times,
        gpus_per_machine=args.gpus_per_machine,
        spares=_int_or(args.spares, {"auto": None, "unlimited": UNLIMITED}, "--spares"),
        reserve=_int_or(args.reserve, {"auto": None}, "--reserve"), pool=args.pool,
        seed=args.seed, refill_spares=args.refill_spares, limits=limits,
        hang_phases=args.hang_rule == "phases",
        run_dir=str(Path(args.out) / "run") if args.out else None)


def summary_markdown(s: dict[str, Any]) -> str:
    d = s["downtime_s"]
    down = sum(d.values()) or 1.0
    lines = [
        f"# Simulated {s['machines']} machines x {s['gpus_per_machine']} GPUs, "
        f"{s['days']:g} days (seed {s['seed']})", "",
        f"- cumulative ETTR: {100 * s['ettr']:.2f} %",
        f"- 1-hour sliding ETTR: min {100 * (s['sliding_ettr_min'] or 0):.1f} %, "
        f"1st percentile {100 * (s['sliding_ettr_p01'] or 0):.1f} %",
        f"- incidents: {s['incidents']} ({', '.join(f'{k} {v}' for k, v in s['by_rung'].items())})",
        f"- in-job spares: {s['spares']}, used {s['spares_used']}; reserve mean "
        f"{s['reserve_mean']:.2f} (min {s['reserve_min']}, empty "
        f"{s['reserve_empty_pct']:.2f} % of the time), handed over {s['handed_over']}",
        f"- mean failover of machine-evicting incidents: "
        f"{s['evicting_failover_mean_s'] or 0:.1f} s",
        "- spare cost: " + ("n/a (unlimited spares)" if s["spare_cost_pct"] is None
                            else f"{s['spare_cost_pct']:.2f} % of the job's machine-time"), "",
        "| downtime | hours | share |", "|---|---|---|",
        *(f"| {k} | {v / 3600:.2f} | {100 * v / down:.1f} % |" for k, v in d.items()), ""]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from slurm_robust.simulate.engine import simulate

    cfg = build_config(args)
    started = time.perf_counter()
    result = simulate(cfg)
    summary = {**result.summary, "engine_events": result.events, "records": result.records,
               "elapsed_s": round(result.elapsed_s, 3)}
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (out / "summary.md").write_text(summary_markdown(summary))
    if args.sweep:
        from slurm_robust.simulate import sweep

        if args.sweep_seeds < 1:
            raise UsageError("--sweep-seeds must be >= 1")
        rows = sweep.run_sweeps(cfg, args.sweep_seeds)
        summary["sweep"] = rows
        if out is not None:
            (out / "sweep.json").write_text(json.dumps(rows, indent=2) + "\n")
            (out / "sweep.md").write_text(sweep.markdown(rows))
            sweep.plot(rows, out / "sweep.png")
    if args.paper_check:
        from slurm_robust.simulate import acceptance

        if args.check_seeds < 1:
            raise UsageError("--check-seeds must be >= 1")
        check = acceptance.paper_check(cfg, args.check_seeds)
        summary["paper_check"] = check
        if out is not None:
            (out / "paper_check.json").write_text(json.dumps(check, indent=2) + "\n")
            (out / "paper_check.md").write_text(acceptance.markdown(check))
    summary["wall_s_total"] = round(time.perf_counter() - started, 3)
    if args.json:
        print(json.dumps(summary))
    else:
        print(summary_markdown(summary))
        if args.sweep:
            print(sweep.markdown(summary["sweep"]))
        if args.paper_check:
            print(acceptance.markdown(summary["paper_check"]))
        if out is not None:
            print(f"event log: {out / 'run' / 'events.jsonl'} (slurm-robust report "
                  f"{out / 'run'} -o {out / 'report'})")
    return 0
