"""The probe layer: every hardware and OS reading a check uses passes through here.

A probe is a named reading (``gpu_count``, ``xid_events``, ``disk_free_bytes``, ...). On
each read, :class:`Probes` first looks for an injected value (the node's
``<state_dir>/inject.json``, written by ``slurm-robust inject probe``, or the ``injected``
mapping a test passes in) and returns it; otherwise it reads the real thing. Everything
after the probe -- thresholds, reasons, journal, drain -- is the real code path, so an
injected Xid exercises exactly what a real one would.

GPU probes read NVML (``slurm_robust.health.nvml``). With no NVML on the node they raise
:class:`NoNVMLError` (the framework turns that into "skipped: no NVML", or a failure when
the site expects GPUs) -- unless some probe of the same read is injected: then the check
runs on the injected readings and the others read as ``None``.

The formats of the values (real or injected) are in :data:`PROBES`.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurm_robust.health import dcgm, netsys
from slurm_robust.health.errors import NoNVMLError, NVMLHungError
from slurm_robust.health.nvml import NvmlReader, read_kmsg

__all__ = ["NETWORK_PROBES", "PROBES", "NoNVMLError", "NVMLHungError", "Probes", "ProbeView",
           "inject_path", "read_injections"]

log = logging.getLogger("slurm_robust.health")

INJECT_FILE = "inject.json"

# name -> the value's format; real readings have the same shape as injected ones.
GPU_PROBES: dict[str, str] = {
    "gpu_count": "int: GPUs NVML sees",
    "xid_events": 'list of {"gpu": int, "xid": int}: Xid events since the last check',
    "ecc_uncorrectable": "list of int per GPU: volatile uncorrectable ECC errors",
    "remap": 'list per GPU of {"pending": bool, "failure": bool, "uncorrectable": int} '
             "(null where unsupported)",
    "retired_pages": 'list per GPU of {"pending": bool, "count": int} (null where unsupported)',
    "temperature_c": "list of int per GPU",
    "throttle_reasons": "list of int per GPU: NVML clocks-throttle-reason bitmask",
    "pcie": 'list per GPU of {"gen": int, "max_gen": int, "width": int, "max_width": int}',
    "nvlink": 'list per GPU of {"up": int, "down": int}: NVLink links by state',
    "compute_procs": 'list of {"gpu": int, "pid": int}: compute processes on the GPUs',
    "gpu_utilization": "list of int per GPU: percent of time a kernel ran (NVML)",
    "sm_clock_mhz": "list of int per GPU: current SM clock",
}
HOST_PROBES: dict[str, str] = {
    "disk_free_bytes": "int (every path) or {path: int}: bytes free to unprivileged users",
    "shm_free_bytes": "int: bytes free in the shared-memory filesystem",
    "mem_available_bytes": "int: MemAvailable from /proc/meminfo",
    "processes": 'list of {"pid": int, "uid": int, "comm": str}',
    "disk_usage_by_uid": "{uid: int} for a path (injected as {path: {uid: int}}): bytes "
                         "of the files each uid owns under it (one filesystem, links not "
                         "followed, bounded walk: a lower bound)",
    "mem_by_uid": "{uid: int}: resident bytes of each uid's processes",
    "mounts": "list of str: mount points",
    "lock_files": 'list of {"path": str, "pid": int|null, "alive": bool, "age_s": float}',
    "kernel_log": 'list of str: kernel-log records as /dev/kmsg gives them '
                  '("pri,seq,usec,flags;text"); the reader keeps its own cursor (seq)',
    "dcgm_diag": 'null where dcgmi is not installed, else {"level": int, "rc": int, '
                 '"tests": [{"name": str, "category": str, "status": "fail"|"warn"|"ok"|'
                 '"skip", "info": str}]} from `dcgmi diag -r LEVEL -j` (health/dcgm.py)',
}
# Network readings from sysfs (slurm_robust.health.netsys); the same injection point.
NETWORK_PROBES: dict[str, str] = {
    "ib_ports": 'list of {"device": str, "port": int, "state": str, "phys_state": str, '
                '"rate": str, "counters": {name: int}} from /sys/class/infiniband',
    "net_ifaces": 'list of {"iface": str, "operstate": str, "carrier": int|null, '
                  '"stats": {name: int}} from /sys/class/net (lo left out)',
}
# Injected only: every NVML read first sleeps this long (rehearses a hung driver).
SIMULATION_PROBES: dict[str, str] = {
    "nvml_delay_s": "float: seconds each NVML read stalls (simulates a hung NVML call)",
}
PROBES: dict[str, str] = {**GPU_PROBES, **HOST_PROBES, **NETWORK_PROBES,
                          **SIMULATION_PROBES}



def inject_path(state_dir: Path) -> Path:
    return state_dir / INJECT_FILE


def read_injections(state_dir: Path) -> dict[str, Any]:
    """The node's injected probe values; {} when none. A corrupt file is an error."""
    path = inject_path(state_dir)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise RuntimeError(f"injection file {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise RuntimeError(f"injection file {path} must hold a JSON object")
    return {k: v for k, v in data.items() if k in PROBES}


def enabled_injections(state_dir: Path, injection_enabled: bool) -> dict[str, Any]:
    """The node's injected probe values when the site config enables injection, else {}:
    every long-lived reader (the in-job monitor, the agent's evidence) goes through this,
    so a leftover inject.json never steers a production node (docs/SECURITY.md)."""
    return read_injections(state_dir) if injection_enabled else {}


class Probes:
    """Readings for one suite run: injected values first, then the real source.

    Args:
        injected: probe name -> value (see :data:`PROBES`); overrides the real reading.
        nvml: an NVML reader (default: ``slurm_robust.health.nvml.NvmlReader``, created on
            first GPU read so nodes without GPUs never load it).
        state_dir: where the Xid cursor lives (``None``: no kernel-log cursor).
    """

    def __init__(self, injected: Mapping[str, Any] | None = None, nvml: Any = None,
                 state_dir: Path | None = None) -> None:
        unknown = sorted(set(injected or {}) - set(PROBES))
        if unknown:
            raise ValueError(f"unknown probe(s) {unknown}; valid: {sorted(PROBES)}")
        self.injected = dict(injected or {})
        self.state_dir = state_dir
        self._nvml = nvml
        self._nvml_error: Exception | None = None
        self._init_lock = threading.Lock()
        self.nvml_hung: str | None = None

    @classmethod
    def for_node(cls, state_dir: Path, injection_enabled: bool = False) -> Probes:
        """Real probes of a node, overlaid with ``inject.json`` only when the site config
        enables injection (a leftover file must not steer a production node)."""
        if not injection_enabled:
            if (state_dir / INJECT_FILE).exists():
                log.warning("ignoring %s: injection_enabled is false in the site config",
                            state_dir / INJECT_FILE)
            return cls({}, state_dir=state_dir)
        return cls(read_injections(state_dir), state_dir=state_dir)

    def view(self) -> ProbeView:
        return ProbeView(self)

    def nvml_reader(self) -> Any:
        with self._init_lock:
            if self._nvml is None and self._nvml_error is None:
                try:
                    self._nvml = NvmlReader(self.state_dir)
                except NoNVMLError as exc:
                    self._nvml_error = exc
            if self._nvml_error is not None:
                raise NoNVMLError(str(self._nvml_error))
            return self._nvml


class ProbeView:
    """One check's window on :class:`Probes`: records whether an injected value was used
    and whether the check is inside an NVML call (for the hung-NVML verdict)."""

    def __init__(self, probes: Probes) -> None:
        self._p = probes
        self.used_injected = False
        self.in_nvml = False

    def mark_nvml_hung(self, budget_s: float) -> None:
        self._p.nvml_hung = f"a call did not return within {budget_s:g} s"

    def injected(self, name: str) -> bool:
        return name in self._p.injected

    # --- GPU ---------------------------------------------------------------------------
    def gpu(self, *names: str) -> dict[str, Any]:
        """Read GPU probes; injected ones win. Raises NoNVMLError when NVML is absent and
        none of ``names`` is injected (then missing ones read as None)."""
        out: dict[str, Any] = {}
        missing = []
        for name in names:
            if name not in GPU_PROBES:
                raise ValueError(f"{name!r} is not a GPU probe")
            if name in self._p.injected:
                self.used_injected = True
                out[name] = self._p.injected[name]
            else:
                missing.append(name)
        for name in missing:
            try:
                out[name] = self._read_nvml(name)
            except NoNVMLError:
                if len(missing) == len(names):
                    raise
                out[name] = None
        return out

    def _read_nvml(self, name: str) -> Any:
        if self._p.nvml_hung:
            raise NVMLHungError(self._p.nvml_hung)
        self.in_nvml = True
        try:
            delay = self._p.injected.get("nvml_delay_s")
            if delay:
                self.used_injected = True
                time.sleep(float(delay))
            return getattr(self._p.nvml_reader(), name)()
        finally:
            self.in_nvml = False

    # --- host --------------------------------------------------------------------------
    def get(self, name: str, *args: Any) -> Any:
        """Read a host or network probe (``disk_free_bytes`` takes a path, ``lock_files``
        patterns)."""
        if name not in HOST_PROBES and name not in NETWORK_PROBES:
            raise ValueError(f"{name!r} is not a host or network probe")
        if name in self._p.injected:
            value = self._p.injected[name]
            if name in ("disk_free_bytes", "disk_usage_by_uid") and isinstance(value, dict):
                if str(args[0]) in value:
                    self.used_injected = True
                    return value[str(args[0])]
            else:
                self.used_injected = True
                return value
        return _HOST_READERS[name](*args)


def _disk_free(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _shm_free(path: str = "/dev/shm") -> int:
    return _disk_free(path)


def _mem_available() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError("MemAvailable not in /proc/meminfo")


#: Bounds of the usage walk: a /tmp with millions of files must not stall the prolog.
USAGE_WALK_ENTRIES = 200_000
USAGE_WALK_S = 1.0


def _disk_usage_by_uid(path: str) -> dict[int, int]:
    """Bytes allocated to each uid's files under ``path`` (st_blocks, so sparse files
    count what they hold), on its filesystem only, without following links; the walk
    stops after USAGE_WALK_ENTRIES entries or USAGE_WALK_S, so it is a lower bound."""
    out: dict[int, int] = {}
    dev = os.lstat(path).st_dev
    stack, seen, deadline = [path], 0, time.monotonic() + USAGE_WALK_S
    while stack and seen < USAGE_WALK_ENTRIES and time.monotonic() < deadline:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_dev != dev:
                continue  # another filesystem mounted below: not this one's space
            out[st.st_uid] = out.get(st.st_uid, 0) + st.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return out


def _mem_by_uid() -> dict[int, int]:
    page = os.sysconf("SC_PAGE_SIZE")
    out: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            uid = entry.stat().st_uid
            with open(f"/proc/{entry.name}/statm", "rb") as fh:
                resident = int(fh.read(256).split()[1])
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
        out[uid] = out.get(uid, 0) + resident * page
    return out


def _processes() -> list[dict[str, Any]]:
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            uid = entry.stat().st_uid
            # Binary and decoded with replacement: any user names their processes, and
            # a name that is not UTF-8 must not crash the check.
            with open(f"/proc/{entry.name}/comm", "rb") as fh:
                comm = fh.read(64).decode("utf-8", "replace").strip()
        except OSError:
            continue  # the process exited while we looked
        out.append({"pid": int(entry.name), "uid": uid, "comm": comm})
    return out


def _mounts() -> list[str]:
    with open("/proc/self/mounts", "rb") as fh:
        # Octal escapes (\040 for a space) are how the kernel writes odd characters;
        # users can mount (FUSE) paths that are not UTF-8: decode with replacement.
        return [_unescape_mount(line.split()[1])
                for line in fh if len(line.split()) > 1]


def _unescape_mount(raw: bytes) -> str:
    out, i = bytearray(), 0
    while i < len(raw):
        if raw[i:i + 1] == b"\\" and raw[i + 1:i + 4].isdigit() and len(raw[i + 1:i + 4]) == 3:
            out.append(int(raw[i + 1:i + 4], 8) & 0xFF)
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return out.decode("utf-8", "replace")


def _lock_files(patterns: list[str]) -> list[dict[str, Any]]:
    now = time.time()
    out = []
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            try:
                st = os.stat(path)
                text = Path(path).read_text(errors="replace")[:64].strip()
            except OSError:
                continue
            pid = int(text) if text.isdigit() else None
            out.append({"path": path, "pid": pid, "alive": _pid_alive(pid),
                        "age_s": round(now - st.st_mtime, 1)})
    return out


def _pid_alive(pid: int | None) -> bool:
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kernel_log() -> list[str]:
    # The one kernel-log reader (nvml.read_kmsg); OSError without /dev/kmsg access.
    return read_kmsg()


_HOST_READERS: dict[str, Any] = {
    "disk_free_bytes": _disk_free, "shm_free_bytes": _shm_free,
    "mem_available_bytes": _mem_available, "processes": _processes, "mounts": _mounts,
    "disk_usage_by_uid": _disk_usage_by_uid, "mem_by_uid": _mem_by_uid,
    "lock_files": _lock_files, "kernel_log": _kernel_log, "dcgm_diag": dcgm.run_diag,
    "ib_ports": netsys.ib_ports, "net_ifaces": netsys.net_ifaces,
}
