"""The agents' plans for a generation, as pure functions of the run's current shape.

A successor controller rebuilds the same plans from ``state.json`` (failover.py), so they
depend only on what :class:`PlanContext` holds and on the generation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control import replay
from slurm_robust.launcher.control.generation import Generation, Member
from slurm_robust.launcher.control.hot_update import CodeFields
from slurm_robust.launcher.enums import Role
from slurm_robust.launcher.messages import Plan
from slurm_robust.launcher.ports import rendezvous_port


@dataclass(frozen=True)
class PlanContext:
    """What every plan of one generation shares. ``code``: the plans' code fields (the
    version the workers run, hot_update.py)."""

    cfg: RunConfig
    job_id: str | None
    run_id: str
    members: Mapping[int, Member]
    spares: Sequence[int]
    code: CodeFields


def generation_plans(ctx: PlanContext, gen: Generation) -> dict[int, Plan]:
    """Every agent's plan for ``gen``: its slots active, the rest parked or evicted."""
    slots, g, members = gen.slots, ctx.cfg.workers_per_node, ctx.members
    rank_nodes = [members[i].node for i in slots for _ in range(g)]
    port = rendezvous_port(ctx.cfg.master_port, ctx.job_id, gen.attempt)
    plans: dict[int, Plan] = {}
    for slot, index in enumerate(slots):
        plans[index] = Plan(role=Role.ACTIVE, gen=gen.number, attempt=gen.attempt,
                            world_size=ctx.cfg.world_size,
                            master_addr=members[slots[0]].addr, master_port=port,
                            rank_nodes=rank_nodes, run_id=ctx.run_id,
                            max_restarts=ctx.cfg.max_restarts, slot=slot,
                            ranks=list(range(slot * g, (slot + 1) * g)), **ctx.code)
    return _with_parked(ctx, gen, plans)


def replay_plans(ctx: PlanContext, gen: Generation, groups: list[list[int]],
                 rp: replay.ReplayRun) -> dict[int, Plan]:
    """Each replay group a world of its own: its ranks renumbered from 0, its own master
    and port; each worker told its rank in the run (for its own snapshot)."""
    g, slots, members, code = ctx.cfg.workers_per_node, gen.slots, ctx.members, ctx.code
    env = dict(code.get("env") if code.get("env") is not None else ctx.cfg.env)
    plans: dict[int, Plan] = {}
    for number, group in enumerate(groups):
        attempt = gen.attempt + number
        port = rendezvous_port(ctx.cfg.master_port, ctx.job_id, attempt)
        rank_nodes = [members[slots[m]].node for m in group for _ in range(g)]
        for pos, m in enumerate(group):
            spec = replay.ReplaySpec(rp.id, rp.phase.value, number,
                                     tuple(range(m * g, (m + 1) * g)),
                                     ctx.cfg.world_size, rp.restore_step, rp.until_step)
            plans[slots[m]] = Plan(
                role=Role.ACTIVE, gen=gen.number, attempt=attempt,
                world_size=len(group) * g,
                master_addr=members[slots[group[0]]].addr, master_port=port,
                rank_nodes=rank_nodes, run_id=ctx.run_id, max_restarts=0,
                slot=pos, ranks=list(range(pos * g, (pos + 1) * g)),
                **{**code, "env": {**env, replay.REPLAY_ENV: spec.to_env()}})
    return _with_parked(ctx, gen, plans)


def _with_parked(ctx: PlanContext, gen: Generation, plans: dict[int, Plan]
                 ) -> dict[int, Plan]:
    """``plans`` plus every live agent off the slots: a parked spare, or evicted."""
    for index, member in ctx.members.items():
        if gen.slot_of(index) is not None or member.lost:
            continue
        role = Role.SPARE if index in ctx.spares else Role.EVICTED
        plans[index] = Plan(role=role, gen=gen.number, attempt=gen.attempt)
    return plans
