"""Incident taxonomy (ByteRobust Table 1) and recovery rungs, as docs/SCHEMAS.md names them.

Kept in one place so loaders give every class column the same categorical dtype and the
report lists classes in a stable order even when a class never occurred.
"""

from __future__ import annotations

TAXONOMY: dict[str, tuple[str, ...]] = {
    "explicit": ("cuda_error", "nccl_error", "gpu_memory_error", "oom", "cpu_oom",
                 "network_error", "disk_error", "node_lost", "worker_crash", "user_code",
                 "kernel_panic"),
    "implicit": ("hang", "nan", "loss_spike", "fail_slow"),
    "manual": ("code_change", "admin"),
}

CATEGORIES: tuple[str, ...] = tuple(TAXONOMY)
CLASSES: tuple[str, ...] = tuple(c for classes in TAXONOMY.values() for c in classes)
CLASS_CATEGORY: dict[str, str] = {c: cat for cat, classes in TAXONOMY.items() for c in classes}

# The recovery ladder, cheapest first (ARCHITECTURE.md "Recovery ladder").
RUNGS: tuple[str, ...] = ("in_place", "spare", "requeue", "stop")

RUN_STATUSES: tuple[str, ...] = ("completed", "stopped", "failed")
HEALTH_STATUSES: tuple[str, ...] = ("ok", "warn", "fail", "skip", "error")
