"""The ByteRobust paper's numbers (arXiv 2509.16293, SOSP '25) used as defaults.

Each constant names the table or section it comes from; docs/SIMULATOR.md lists them
with the assumptions made where the paper gives no number.
"""

from __future__ import annotations

import math

#: Table 1: symptom -> share of incidents (percent). The prose counts (38,236 explicit,
#: 5,948 implicit) differ from the table's sums (39,687, 6,096); the shares are used.
TABLE1_SHARES: dict[str, float] = {
    "CUDA error": 36.1, "CPU overload": 11.0, "CPU OOM": 10.1, "Disk full": 5.0,
    "Disk fault": 0.1, "InfiniBand error": 2.9, "FS mount": 2.1, "HDFS": 2.0,
    "Container": 1.4, "External service": 0.2, "Kernel panic": 0.4,
    "GPU memory error": 0.3, "GPU unavailable": 0.1, "Job hang": 9.9,
    "MFU decline": 0.8, "NaN": 0.3, "Code/data change": 17.3,
}

#: Table 3: detection with real-time inspection, seconds.
DETECT_GPU_S = 10.0
DETECT_NIC_S = 30.0
DETECT_KERNEL_S = 2.0
#: Section 2: explicit failures are detected in about 60 s.
DETECT_EXPLICIT_S = 60.0

#: Table 6: ByteRobust resolution time (mean, max) in seconds, taken as detection plus
#: localisation.
RESOLVE_S: dict[str, tuple[float, float]] = {
    "CUDA error": (93.0, 600.0), "InfiniBand error": (60.0, 0.0), "HDFS": (58.0, 0.0),
    "Kernel panic": (109.0, 0.0), "GPU memory error": (10.0, 0.0),
    "GPU unavailable": (10.0, 0.0), "NaN": (4289.0, 7200.0), "Code change": (57.0, 0.0),
}

#: Table 7: time to resume after a code update, by machine count (16-GPU machines):
#: requeue vs in-place hot update, seconds.
TABLE7_MACHINES = (128, 256, 512, 1024)
TABLE7_REQUEUE_S = (454.0, 545.0, 635.0, 768.0)
TABLE7_HOT_UPDATE_S = (46.0, 51.0, 54.0, 65.0)

#: Table 5 and section 6.2: warm-standby sizes for 128/256/512/1,024 machines.
TABLE5_SPARES = {128: 2, 256: 2, 512: 3, 1024: 4}
#: Section 6.2 / 8.2: warm standby vs requeue, and vs an oracle with unlimited standbys.
WARM_VS_REQUEUE = 10.87
WARM_VS_ORACLE_PCT = 5.19
#: Section 8.2's warm-standby evaluation: a fixed 1 % chance that an eviction is a
#: switch failure taking down 32 machines; Table 3: a switch is declared down after two
#: 30 s port checks.
SWITCH_FAILURE_PROB = 0.01
SWITCH_FAILURE_MACHINES = 32
DETECT_SWITCH_S = 2 * DETECT_NIC_S
#: Section 8: cumulative ETTR "up to 97 %", at most 50 min unproductive in a 1-hour window.
CUMULATIVE_ETTR = 0.97
MAX_UNPRODUCTIVE_PER_HOUR_MIN = 50.0
#: Section 6.2: the per-machine daily failure probability behind Table 5. The project's
#: reserve prior (0.0012, ReserveConfig.failure_prob_prior) reproduces Table 5 exactly.
MACHINE_FAIL_PER_DAY = 0.0012
#: Section 8: production jobs of up to 1,200 machines x 8 GPUs.
PRODUCTION_MACHINES = 1200


def table7(machines: int, values: tuple[float, ...]) -> float:
    """Table 7 at ``machines``: linear in log2(machines), extrapolated at both ends."""
    xs = [math.log2(m) for m in TABLE7_MACHINES]
    x = math.log2(max(machines, 1))
    i = 0 if x <= xs[1] else (len(xs) - 2 if x >= xs[-2] else
                              max(j for j in range(len(xs) - 1) if xs[j] <= x))
    slope = (values[i + 1] - values[i]) / (xs[i + 1] - xs[i])
    return max(values[i] + slope * (x - xs[i]), 0.0)
