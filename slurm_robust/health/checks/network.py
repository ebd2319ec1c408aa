"""Network checks: InfiniBand/RoCE ports and Ethernet links (quick and deep suites).

Both read sysfs through the probe layer (``ib_ports``, ``net_ifaces``), so the prolog,
the epilog and the in-job monitor run the same code, and ``inject probe`` can take a
port down. A node without InfiniBand passes the port check (nothing to check).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurm_robust.health.framework import (
    QUICK_AND_DEEP,
    CheckContext,
    InJob,
    Outcome,
    check,
    fail,
    ok,
    warn,
)
from slurm_robust.taxonomy import FailureClass

NET_BUDGET_S = 2.0
#: Port error counters worth showing as evidence (the rest stay in sysfs).
IB_ERROR_COUNTERS = ("link_downed", "link_error_recovery", "symbol_error",
                     "port_rcv_errors", "local_link_integrity_errors",
                     "excessive_buffer_overrun_errors")
ETH_ERROR_STATS = ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped", "rx_crc_errors",
                   "tx_carrier_errors")


def port_name(port: Mapping[str, Any]) -> str:
    return f"{port.get('device')}/{port.get('port')}"


def port_errors(port: Mapping[str, Any]) -> dict[str, int]:
    counters = port.get("counters") or {}
    return {k: int(counters[k]) for k in IB_ERROR_COUNTERS if k in counters}


def iface_errors(iface: Mapping[str, Any]) -> dict[str, int]:
    stats = iface.get("stats") or {}
    return {k: int(stats[k]) for k in ETH_ERROR_STATS if k in stats}


# In-job: an alert is a warning; the monitor makes repeated alerts within its window
# fatal (its ``network`` kind's alerts and window_s).
@check("net_ib_ports", QUICK_AND_DEEP, NET_BUDGET_S, {"ignore": []},
       in_job=InJob("network", FailureClass.NETWORK))
def net_ib_ports(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """Every InfiniBand/RoCE port (``device/port`` not in ``ignore``) is ACTIVE/LinkUp."""
    ports = [p for p in ctx.probes.get("ib_ports") or []
             if port_name(p) not in set(params["ignore"])]
    evidence = {"ports": [{"port": port_name(p), "state": p.get("state"),
                           "phys_state": p.get("phys_state"), "rate": p.get("rate"),
                           "errors": port_errors(p)} for p in ports]}
    down = [p for p in ports if str(p.get("state")).upper() != "ACTIVE"
            or str(p.get("phys_state")).lower() != "linkup"]
    if down:
        p = down[0]
        more = f" (+{len(down) - 1} more)" if len(down) > 1 else ""
        return fail(f"port {port_name(p)} {p.get('state')}/{p.get('phys_state')}{more}, "
                    "expected ACTIVE/LinkUp", down=[port_name(x) for x in down], **evidence)
    return ok(**evidence)


@check("net_eth_links", QUICK_AND_DEEP, NET_BUDGET_S, {"required": [], "fail": False},
       in_job=InJob("network", FailureClass.NETWORK))
def net_eth_links(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """Ethernet links up (operstate ``up`` or ``unknown`` with carrier). An interface in
    ``required`` that is down or missing fails; any other one that lost its carrier warns
    (``fail``: fails), since nodes often carry unused ports."""
    ifaces = ctx.probes.get("net_ifaces") or []
    by_name = {str(i.get("iface")): i for i in ifaces}
    evidence = {"ifaces": [{"iface": name, "operstate": i.get("operstate"),
                            "carrier": i.get("carrier"), "errors": iface_errors(i)}
                           for name, i in by_name.items()]}
    missing = [n for n in params["required"] if n not in by_name]
    if missing:
        return fail(f"interface {missing[0]} missing, expected it present and up",
                    missing=missing, **evidence)
    # An interface administratively down (carrier unreadable) was never configured for
    # use; only a link that lost its carrier counts, unless the site requires the name.
    down = [n for n, i in by_name.items() if not _link_up(i)
            and (i.get("carrier") is not None or n in params["required"])]
    required_down = [n for n in down if n in params["required"]]
    if required_down or (down and params["fail"]):
        name = (required_down or down)[0]
        return fail(f"interface {name} {by_name[name].get('operstate')}, expected up",
                    down=down, **evidence)
    if down:
        return warn(f"interface {down[0]} {by_name[down[0]].get('operstate')}, expected up",
                    down=down, **evidence)
    return ok(**evidence)


def _link_up(iface: Mapping[str, Any]) -> bool:
    state = str(iface.get("operstate"))
    # "unknown": drivers (veth, tun) that do not report operstate; carrier then decides.
    return state == "up" or (state == "unknown" and iface.get("carrier") == 1)
