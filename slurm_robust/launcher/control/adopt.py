"""A successor controller's ``gather``: the running generation rebuilt from state.json.

Pure of the run: :func:`ready` says whether the surviving agents have been waited for
long enough, :func:`rebuild` places them on the saved slots. The recovery owner then has
the applier adopt the generation and hands the lost agents to the ladder like any lost
node (spare rung, or requeue without a spare); failover.py has the takeover itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from slurm_robust.launcher.control.generation import Generation, Member
from slurm_robust.launcher.control.state import RunState


def ready(members: Mapping[int, Member], waited: float, heartbeat_timeout_s: float) -> bool:
    """Every live agent has reported to this controller, or a heartbeat timeout passed."""
    live = [m for m in members.values() if not m.lost]
    return not (any(not getattr(m, "heard", True) for m in live)
                and waited < heartbeat_timeout_s)


def rebuild(st: RunState, members: Mapping[int, Member], now: float
            ) -> tuple[Generation, list[int]] | str:
    """The saved generation on the agents of its nodes, and the live spares; or why it
    cannot be rebuilt."""
    by_node = {m.node: i for i, m in members.items()}
    unknown = [n for n in st.slots if n not in by_node]
    if unknown:
        return (f"takeover: slot node(s) {unknown} are not in the saved membership; "
                "cannot rebuild the run")
    slots = [by_node[n] for n in st.slots]
    spares = [by_node[n] for n in st.spares if n in by_node and not members[by_node[n]].lost]
    return Generation(st.gen, st.attempt, slots, now), spares
