"""A discrete-event fleet simulator that runs this project's own decision code.

One long training job on a synthetic fleet goes through the real recovery ladder
(:func:`slurm_robust.launcher.control.ladder.decide`), the real fail-slow vote, and a
warm reserve sized and refilled by the real reserve planning; the simulator writes the
run event log that ``slurm-robust report`` reads. Modules, one job each:

- :mod:`.dists`: time distributions (fixed, exponential, uniform, empirical).
- :mod:`.paper`: the ByteRobust paper's numbers used as defaults (failure mix, times).
- :mod:`.config`: the failure mix, recovery times and run settings, and their files.
- :mod:`.measured`: recovery times measured in this project's rehearsal event logs.
- :mod:`.trace`: the pre-drawn incident trace (common random numbers across what-ifs).
- :mod:`.detectors`: hang and fail-slow times from the launcher's own detectors.
- :mod:`.fleet`: machines, drain, deep check, repair and the idle pool.
- :mod:`.reserve`: the reserve partition under the real sizing and reconcile planning.
- :mod:`.results`: the incident record the job hands to metrics and the event log.
- :mod:`.job`: the job under the real ladder.
- :mod:`.engine`: wires them on one simpy environment and returns the result.
- :mod:`.metrics`: ETTR (cumulative, 1-hour sliding), downtime split, summary.
- :mod:`.eventlog`: the run event log (docs/SCHEMAS.md ``slurm_robust.event``).
- :mod:`.sweep`: what-if sweeps as one table and one plot.
- :mod:`.acceptance`: the side-by-side check against the paper's numbers.
"""
