"""Network readings from sysfs: InfiniBand/RoCE ports and Ethernet interfaces.

Only the probe layer (probes.py) calls these; checks read them as the ``ib_ports`` and
``net_ifaces`` probes, so a rehearsal can inject a flapping port through
``slurm-robust inject probe``. The roots are parameters so a unit test reads a fake tree.

- ``/sys/class/infiniband/<dev>/ports/<n>/state`` reads ``4: ACTIVE``, ``phys_state``
  ``5: LinkUp``, ``rate`` ``200 Gb/sec (4X HDR)``, ``counters/<name>`` one integer each;
- ``/sys/class/net/<iface>/operstate`` (``up``, ``down``, ``unknown``), ``carrier``
  (``1``/``0``; unreadable while the interface is administratively down) and
  ``statistics/<name>`` (``rx_bytes``, ``rx_errors``, ...).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

IB_ROOT = "/sys/class/infiniband"
NET_ROOT = "/sys/class/net"


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(path: Path) -> int | None:
    text = _text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _strip_code(text: str | None) -> str:
    """``4: ACTIVE`` -> ``ACTIVE`` (the kernel prefixes the numeric code)."""
    if text is None:
        return "unknown"
    return text.split(":", 1)[1].strip() if ":" in text else text


def _counters(folder: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        value = _int(folder / name)
        if value is not None:
            out[name] = value
    return out


def ib_ports(root: str = IB_ROOT) -> list[dict[str, Any]]:
    """Every port of every RDMA device; [] on a node without InfiniBand/RoCE."""
    out: list[dict[str, Any]] = []
    base = Path(root)
    try:
        devices = sorted(os.listdir(base))
    except OSError:
        return out
    for dev in devices:
        ports = base / dev / "ports"
        try:
            numbers = sorted(int(p) for p in os.listdir(ports) if p.isdigit())
        except OSError:
            continue
        for n in numbers:
            port = ports / str(n)
            out.append({"device": dev, "port": n,
                        "state": _strip_code(_text(port / "state")),
                        "phys_state": _strip_code(_text(port / "phys_state")),
                        "rate": _text(port / "rate") or "",
                        "counters": _counters(port / "counters")})
    return out


def net_ifaces(root: str = NET_ROOT) -> list[dict[str, Any]]:
    """Every network interface but loopback, with link state and statistics."""
    out: list[dict[str, Any]] = []
    base = Path(root)
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return out
    for name in names:
        if name == "lo":
            continue
        iface = base / name
        out.append({"iface": name, "operstate": _text(iface / "operstate") or "unknown",
                    "carrier": _int(iface / "carrier"),
                    "stats": _counters(iface / "statistics")})
    return out
