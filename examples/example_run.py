"""Write an example run directory to try `slurm-robust report` on, without a cluster.

    python examples/example_run.py runs/example
    slurm-robust report runs/example -o runs/example/report

The records are the ones a robust run writes (docs/SCHEMAS.md), from the synthetic run
generator the analysis tests use (rehearsal/slurm_robust_rehearsal/synth/runs.py): 60 steps of
10 s on three nodes, with a killed worker restarted in place, a lost node replaced by a
spare, and a NaN rolled back one step. The figures are exact by construction; a real
run's come from `make demo` or your own jobs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from slurm_robust.analysis.loaders import EVENTS_FILE, VERDICTS_FILE
from slurm_robust_rehearsal.synth.runs import Fault, synth_run, write_run_dir

FAULTS = (Fault(10, "worker_signal", "in_place", nodes=("node2",)),
          Fault(25, "node_lost", "spare", detect_s=8.0, nodes=("node3",)),
          Fault(40, "nan", "in_place", restore_back=1, nodes=("node1",)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="directory to write (its records are replaced)")
    run_dir = Path(parser.parse_args().run_dir)
    # The writer appends, as the launcher does; an example written twice must not
    # hold two runs.
    for name in (EVENTS_FILE, VERDICTS_FILE):
        (run_dir / name).unlink(missing_ok=True)
    run = synth_run("example", steps=60, step_time_s=10.0,
                    nodes=("node1", "node2", "node3"), faults=FAULTS)
    write_run_dir(run_dir, run)
    print(f"{run_dir}: {len(run.events)} events, {len(FAULTS)} incidents, "
          f"ETTR {run.truth.ettr:.3f}")


if __name__ == "__main__":
    main()
