"""Real GPU readings through NVML (``pynvml`` from nvidia-ml-py), one method per GPU probe.

Only :class:`slurm_robust.health.probes.Probes` creates this reader, on the first GPU read
that is not injected, so nodes without GPUs never import pynvml.

Xid events "since the last check" -- where they can come from:

- NVML's event API (``nvmlDeviceRegisterEvents`` + ``nvmlEventSetWait``) only reports
  events that happen while this process is registered, so it catches Xids raised during
  the short wait (``XID_WAIT_MS``), not earlier ones;
- the kernel log (``/dev/kmsg``, ``NVRM: Xid (PCI:0000:3b:00): 79, ...``) keeps them. The
  node prolog/epilog run as root on a real node and can read it; we keep a cursor (the last
  kernel sequence number seen) in ``<state_dir>/xid_cursor.json`` so each Xid is reported
  once. In containers without ``/dev/kmsg`` access this source is simply unavailable, and
  the evidence says which sources were read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from slurm_robust.health.errors import NoNVMLError
from slurm_robust.health.kernel_formats import (
    KernelEventKind,
    normalise_bus_id,
    parse_record,
    split_record,
)
from slurm_robust.records import write_json_atomic

XID_WAIT_MS = 20
KMSG = "/dev/kmsg"

__all__ = ["KMSG", "XID_WAIT_MS", "NvmlReader", "normalise_bus_id", "parse_kmsg_xids",
           "read_kmsg"]


def parse_kmsg_xids(lines: list[str], after_seq: int) -> tuple[list[tuple[str, int]], int]:
    """Xids in ``/dev/kmsg`` records (``pri,seq,usec,flags;text``) with seq > after_seq.

    Returns ([(pci_bus, xid)], highest seq seen). Only the driver's own ``NVRM: Xid``
    lines count, at the start of a kernel-logged record (``kernel_formats``): a process
    or file name that contains Xid text never drains the node. Pure, so it is tested on
    recorded lines.
    """
    found: list[tuple[str, int]] = []
    last = after_seq
    for line in lines:
        record = split_record(line)
        if record is None:
            continue
        last = max(last, record.seq)
        if record.seq <= after_seq:
            continue
        event = parse_record(record)
        if event is not None and event.kind is KernelEventKind.XID \
                and event.bus is not None and event.xid is not None:
            found.append((event.bus, event.xid))
    return found, last


class NvmlReader:
    """NVML readings shaped like the probes in ``probes.GPU_PROBES``."""

    def __init__(self, state_dir: Path | None = None) -> None:
        try:
            import pynvml  # type: ignore[import-untyped]
        except ImportError as exc:
            raise NoNVMLError("pynvml is not installed") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NoNVMLError(str(exc)) from exc
        self.nv = pynvml
        self.state_dir = state_dir
        count = pynvml.nvmlDeviceGetCount()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def _each(self, fn: Any) -> list[Any]:
        out = []
        for h in self.handles:
            try:
                out.append(fn(h))
            except self.nv.NVMLError_NotSupported:
                out.append(None)
        return out

    def gpu_count(self) -> int:
        return len(self.handles)

    def ecc_uncorrectable(self) -> list[Any]:
        nv = self.nv
        return self._each(lambda h: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC))

    def remap(self) -> list[Any]:
        def one(h: Any) -> dict[str, Any]:
            corr, unc, pending, failure = self.nv.nvmlDeviceGetRemappedRows(h)
            return {"pending": bool(pending), "failure": bool(failure),
                    "uncorrectable": int(unc), "correctable": int(corr)}
        return self._each(one)

    def retired_pages(self) -> list[Any]:
        nv = self.nv

        def one(h: Any) -> dict[str, Any]:
            pending = nv.nvmlDeviceGetRetiredPagesPendingStatus(h)
            count = len(nv.nvmlDeviceGetRetiredPages(
                h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))
            return {"pending": bool(pending), "count": count}
        return self._each(one)

    def temperature_c(self) -> list[Any]:
        nv = self.nv
        return self._each(lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))

    def throttle_reasons(self) -> list[Any]:
        return self._each(self.nv.nvmlDeviceGetCurrentClocksThrottleReasons)

    def pcie(self) -> list[Any]:
        nv = self.nv
        return self._each(lambda h: {
            "gen": nv.nvmlDeviceGetCurrPcieLinkGeneration(h),
            "max_gen": nv.nvmlDeviceGetMaxPcieLinkGeneration(h),
            "width": nv.nvmlDeviceGetCurrPcieLinkWidth(h),
            "max_width": nv.nvmlDeviceGetMaxPcieLinkWidth(h)})

    def nvlink(self) -> list[Any]:
        nv = self.nv

        def one(h: Any) -> dict[str, int]:
            up = down = 0
            for link in range(nv.NVML_NVLINK_MAX_LINKS):
                try:
                    state = nv.nvmlDeviceGetNvLinkState(h, link)
                except nv.NVMLError:
                    continue  # link not present on this GPU
                up, down = (up + 1, down) if state else (up, down + 1)
            return {"up": up, "down": down}
        return self._each(one)

    def compute_procs(self) -> list[dict[str, int]]:
        out = []
        for i, procs in enumerate(self._each(self.nv.nvmlDeviceGetComputeRunningProcesses)):
            out.extend({"gpu": i, "pid": int(p.pid)} for p in procs or [])
        return out

    def gpu_utilization(self) -> list[Any]:
        return self._each(lambda h: int(self.nv.nvmlDeviceGetUtilizationRates(h).gpu))

    def sm_clock_mhz(self) -> list[Any]:
        nv = self.nv
        return self._each(lambda h: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))

    def xid_events(self) -> list[dict[str, int]]:
        return self._nvml_xids() + self._kmsg_xids()

    def _nvml_xids(self) -> list[dict[str, int]]:
        nv = self.nv
        events = nv.nvmlEventSetCreate()
        index = {}
        try:
            for i, h in enumerate(self.handles):
                try:
                    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, events)
                    index[id(h)] = i
                except nv.NVMLError_NotSupported:
                    continue
            out = []
            while True:
                try:
                    data = nv.nvmlEventSetWait(events, XID_WAIT_MS)
                except nv.NVMLError_Timeout:
                    return out
                gpu = next((i for i, h in enumerate(self.handles)
                            if _same_device(nv, h, data.device)), -1)
                out.append({"gpu": gpu, "xid": int(data.eventData), "source": "nvml"})
        finally:
            nv.nvmlEventSetFree(events)

    def _kmsg_xids(self) -> list[dict[str, int]]:
        if self.state_dir is None:
            return []
        cursor = self.state_dir / "xid_cursor.json"
        try:
            after = int(json.loads(cursor.read_text()).get("seq", -1))
        except (OSError, ValueError, AttributeError):
            after = -1
        try:
            lines = read_kmsg()
        except OSError:
            return []  # no kernel-log access here (containers); see the module docstring
        found, last = parse_kmsg_xids(lines, after)
        write_json_atomic(cursor, {"seq": last})
        buses = {}
        for i, h in enumerate(self.handles):
            bus = self.nv.nvmlDeviceGetPciInfo(h).busId
            buses[normalise_bus_id(bus if isinstance(bus, str) else bus.decode())] = i
        return [{"gpu": buses.get(bus, -1), "xid": xid, "source": "kmsg"}
                for bus, xid in found]


def _same_device(nv: Any, a: Any, b: Any) -> bool:
    try:
        return bool(nv.nvmlDeviceGetIndex(a) == nv.nvmlDeviceGetIndex(b))
    except nv.NVMLError:
        return False


def read_kmsg(max_records: int = 100_000) -> list[str]:
    """Every record currently in the kernel ring buffer (non-blocking)."""
    fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    lines = []
    try:
        for _ in range(max_records):
            try:
                raw = os.read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:
                continue  # a record was overwritten while we read; go on with the next
            if not raw:
                break
            lines.append(raw.decode(errors="replace").rstrip("\n"))
    finally:
        os.close(fd)
    return lines
