"""One requeue of the job in flight: count what it could get, then ask Slurm.

Both run in a :class:`SlurmAction` thread (a slurmctld outage is waited out there, never
under the controller's lock); the applier (applier.py) polls
:meth:`PendingRequeue.result` on the tick and applies what it says (hold, stop for a
shortfall, or fail on a refusal).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slurm_robust.launcher.control.shortfall import (
    Capacity,
    Choice,
    RequeuePlan,
    ShortfallPolicy,
    plan_requeue,
)
from slurm_robust.launcher.control.slurm_actions import ActionState, SlurmAction

CountFn = Callable[[str, Sequence[str]], Capacity | None]


@dataclass(frozen=True)
class RequeueResult:
    """A finished requeue: ``refused`` (Slurm's error) or the count and the plan taken."""

    refused: str | None = None
    capacity: Capacity | None = None
    plan: RequeuePlan = RequeuePlan(Choice.REQUEUE)


class PendingRequeue:
    """See the module docstring. ``count`` None: no count, the requeue goes ahead."""

    def __init__(self, start: Callable[[str, Callable[[], object]], SlurmAction],
                 job_id: str, exclude: list[str], count: CountFn | None,
                 requeue: Callable[..., None], policy: ShortfallPolicy,
                 world_nodes: int) -> None:
        self._counted: tuple[Capacity | None, RequeuePlan] | None = None

        def count_then_requeue() -> None:
            # Counted first: a requeue the partition and reserve cannot serve would pend
            # with nothing left running to say so.
            cap = count(job_id, exclude) if count is not None else None
            plan = plan_requeue(cap, policy, world_nodes)
            self._counted = (cap, plan)
            if plan.choice is Choice.SHRINK:
                requeue(job_id, exclude, num_nodes=plan.nodes)
            elif plan.choice is Choice.REQUEUE:
                requeue(job_id, exclude)

        self.action = start("requeue", count_then_requeue)

    def result(self) -> RequeueResult | None:
        """None while the action runs."""
        outcome = self.action.outcome()
        if outcome.state is ActionState.FAILED:
            return RequeueResult(refused=outcome.error)
        if outcome.state is not ActionState.DONE:
            return None
        cap, plan = self._counted or (None, RequeuePlan(Choice.REQUEUE))
        return RequeueResult(capacity=cap, plan=plan)
