"""The controller's side of hot update and rollback.

:class:`HotUpdate` is a collaborator of the recovery owner (a detector asks whether an
update is due, the applier takes the plans' code fields from it, and its listener in
listeners.py follows restarts, decisions and steps) and owns which code version the
workers run:

- it polls ``versions/request.json`` (made by ``slurm-robust update``, see versions.py);
- ``--now`` and ``--rollback`` become *due* once a step has finished after the request
  (the per-step snapshot of that step exists, so the restart redoes no finished step);
  recovery then starts a new generation on the same slots: the agents stop their workers
  and start the new version's command, which restores from shared memory. No Slurm call;
- ``--at-next-restart`` is staged (kept in ``versions/current.json``, so a requeue keeps
  it too) and applied by the next generation recovery starts anyway (an in-place or
  spare restart, or the next allocation), or made due at its deadline;
- within ``rollback_steps`` steps of a version taking effect, a failure of a user-code
  class (or NaN / loss spike, or the classifier's ``code_data_change``) switches back to
  the previous version before the ladder restarts the workers; a ladder ``stop`` (the
  same user error again) becomes an in-place restart on the previous version;
- every change is a change-log line (versions.py); a change that took effect is also an
  ``incident`` in the run's event log, class ``code_data_change``, category ``manual``
  (ByteRobust's manual class), rung ``in_place``, from the request (``fault_time``) to
  the first finished step on the new version (``recovered_at``) with the steps redone,
  so the post-mortem counts changes and their downtime like any incident. An automatic
  rollback is recorded by the failure's own incident (``evidence.rollback``) instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypedDict

from slurm_robust.launcher import versions as vs
from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control.events import EventLog, new_incident
from slurm_robust.launcher.enums import Category, Rung
from slurm_robust.launcher.worker_signals import DRAIN_S
from slurm_robust.taxonomy import ROWS, FailureClass, Side, canonical

log = logging.getLogger("slurm_robust.launcher.control.hot_update")

#: How often the request file is looked for: one stat of the run directory per 0.1 s is
#: nothing even on Lustre, and every 0.1 s saved here is downtime saved per update.
POLL_S = 0.1
#: Failure classes that, soon after a change, are the change's fault (user side).
_ROLLBACK_EXTRA = frozenset({FailureClass.NAN, FailureClass.LOSS_SPIKE,
                             FailureClass.CODE_DATA_CHANGE})


class CodeFields(TypedDict, total=False):
    """The code fields of every active plan (messages.Plan): the version's command and
    environment, its number, and whether a change is recorded for this generation."""

    command: list[str]
    env: dict[str, str]
    code_version: int
    code_change: bool
    drain_s: float


class ResumedFields(TypedDict):
    """A ``resumed`` change-log line's fields (docs/SCHEMAS.md "Change log"): the first
    step of a version, and what its change cost."""

    version: int
    from_version: int
    how: str
    step: int
    restored_step: int | None
    applied_step: int | None
    steps_redone: int | None
    downtime_s: float
    restart_s: float


@dataclass
class Effective:
    """A version that took effect: what the rollback window and the downtime need."""

    version: int
    previous: int
    requested_at: float
    applied_at: float
    applied_step: int | None
    rollback_steps: int
    mode: str
    who: str = ""
    message: str = ""
    steps: int = 0
    resumed: bool = False
    automatic: bool = False  # an automatic rollback: the failure's incident records it


class HotUpdate:
    """See the module docstring. Called under the controller's lock only."""

    def __init__(self, cfg: RunConfig, events: EventLog,
                 clock: Callable[[], float]) -> None:
        self.cfg = cfg
        self.run_dir = cfg.run_dir
        self.events = events
        self.clock = clock
        cur = vs.read_current(self.run_dir)
        self.version = self._load(cur["version"])
        self.previous: list[int] = list(cur["previous"])
        raw_staged = cur.get("staged")
        self.staged: vs.UpdateRequest | None = (
            vs.UpdateRequest.from_dict(raw_staged) if isinstance(raw_staged, dict) else None)
        self.due_request: vs.UpdateRequest | None = None
        self.due_after_step: int | None = None
        self.effective: Effective | None = None
        self._last_poll = 0.0

    def _load(self, number: int) -> vs.CodeVersion:
        return vs.load_version(self.run_dir, number, self.cfg.command, self.cfg.env)

    # ------------------------------------------------------------------ plans
    def plan_fields(self) -> CodeFields:
        """What every active plan carries: the version's command and environment
        (version 0: nothing, the agents run the config's), and whether a change is
        recorded for this generation (the classifier's ``change_recorded``)."""
        eff = self.effective
        if self.version.number == 0 and eff is None:
            return {}
        # A change is "recorded" for the generations started within its window only: a
        # user error many steps later is the code's, not the change's.
        recent = eff is not None and eff.steps < max(eff.rollback_steps, 1)
        fields: CodeFields = {"command": list(self.version.command),
                              "env": dict(self.version.env),
                              "code_version": self.version.number, "code_change": recent}
        if eff is not None and not eff.resumed and eff.mode in ("now", "deadline"):
            # The generation before this one ends by choice, right after a step: its
            # workers drain, so that step's snapshot is whole and nothing is redone.
            fields["drain_s"] = DRAIN_S
        return fields

    # ------------------------------------------------------------------ input
    def poll(self, last_step: int | None, now: float) -> None:
        """Take a new request from the run directory (at most every POLL_S)."""
        if now - self._last_poll < POLL_S:
            return
        self._last_poll = now
        got = vs.take_request(self.run_dir)
        if got is None:
            return
        if isinstance(got, str):
            self._change(vs.ChangeEvent.REFUSED, {"version": None, "reason": got}, now)
            return
        req = got
        if req.mode is vs.ApplyMode.ROLLBACK:
            if not self.previous:
                self._change(vs.ChangeEvent.REFUSED, {"version": None, "reason":
                             "nothing to roll back to"}, now)
                return
        else:
            try:
                self._load(int(req.version or 0))
            except Exception as exc:  # noqa: BLE001 - a bad request is refused, run goes on
                self._change(vs.ChangeEvent.REFUSED, {"version": req.version,
                                                      "reason": str(exc)}, now)
                return
        if req.mode is vs.ApplyMode.AT_NEXT_RESTART:
            self.staged = req
            self._save()
            self._change(vs.ChangeEvent.STAGED, {"version": req.version,
                                                 "deadline_s": req.deadline_s}, now)
            return
        self.due_request, self.due_after_step = req, last_step

    def tick(self, last_step: int | None, reports_steps: bool, now: float) -> bool:
        """Whether a change is due now (recovery then restarts in place on it)."""
        self.poll(last_step, now)
        st = self.staged
        if st is not None and st.deadline_s is not None and \
                now >= st.requested_at + st.deadline_s and self.due_request is None:
            log.info("staged version %s reached its deadline: applying now", st.version)
            self.due_request, self.due_after_step = st, last_step
            self.staged = None
            self._save()
        req = self.due_request
        if req is None:
            return False
        # A step boundary: a step finished after the request (the plans ask the workers
        # to drain, so its snapshot is whole). A script that reports no steps has no
        # boundary to wait for.
        if reports_steps and (last_step is None or last_step == self.due_after_step):
            return False
        return True

    # ------------------------------------------------------------------ changes
    def apply_due(self, last_step: int | None, now: float) -> None:
        """Switch to the due request's version (recovery restarts the workers next)."""
        req = self.due_request
        self.due_request = None
        if req is None:
            return
        if req.mode is vs.ApplyMode.ROLLBACK:
            self._roll_back(f"manual rollback by {req.who or '?'}"
                            + (f": {req.message}" if req.message else ""), last_step, now,
                            requested_at=req.requested_at)
            return
        forced = req.mode is vs.ApplyMode.AT_NEXT_RESTART
        self._switch(req, last_step, now, how="deadline" if forced else "now")

    def on_restart(self, last_step: int | None, now: float) -> None:
        """A generation is about to start for a recovery (in place, spare, requeue):
        a staged version goes with it."""
        req = self.staged
        if req is None:
            return
        self.staged = None
        self._switch(req, last_step, now, how="restart")

    def _switch(self, req: vs.UpdateRequest, last_step: int | None, now: float,
                how: str) -> None:
        old = self.version.number
        self.version = self._load(int(req.version or 0))
        self.previous.append(old)
        self.effective = Effective(self.version.number, old, req.requested_at, now,
                                   last_step, req.rollback_steps, how, req.who,
                                   req.message)
        self._save()
        self._change(vs.ChangeEvent.APPLIED, {
            "version": self.version.number, "from_version": old, "how": how,
            "step": last_step, "requested_at": req.requested_at,
            "digest": self.version.digest}, now)
        log.warning("code version %s -> %s (%s) at step %s", old, self.version.number,
                    how, last_step)

    def _roll_back(self, reason: str, last_step: int | None, now: float,
                   requested_at: float | None = None) -> int:
        bad = self.version.number
        back = self.previous.pop() if self.previous else 0
        self.version = self._load(back)
        self.effective = Effective(back, bad, requested_at or now, now, last_step, 0,
                                   "rollback", message=reason,
                                   automatic=requested_at is None)
        self._save()
        self._change(vs.ChangeEvent.ROLLED_BACK, {
            "version": back, "from_version": bad, "step": last_step, "reason": reason,
            "requested_at": requested_at or now}, now)
        log.warning("code version %s rolled back to %s: %s", bad, back, reason)
        return back

    # ------------------------------------------------------------------ outcomes
    def on_step(self, step: int, restored: tuple[int | None, str | None],
                now: float) -> None:
        """A step finished: the downtime of the change that just took effect, and the
        rollback window's count."""
        eff = self.effective
        if eff is None:
            return
        if not eff.resumed:
            eff.resumed = True
            step_from, tier = restored
            redone = None
            if eff.applied_step is not None and step_from is not None:
                redone = max(0, eff.applied_step - step_from)
            fields: ResumedFields = {
                "version": eff.version, "from_version": eff.previous, "how": eff.mode,
                "step": step, "restored_step": step_from, "applied_step": eff.applied_step,
                "steps_redone": redone, "downtime_s": round(now - eff.requested_at, 3),
                "restart_s": round(now - eff.applied_at, 3)}
            self._change(vs.ChangeEvent.RESUMED, fields, now)
            if not eff.automatic:
                self._incident(eff, fields, tier, now)
        eff.steps += 1

    def rollback_reason(self, cls: str) -> str | None:
        """Why a failure of class ``cls`` is the new version's (a user class within the
        rollback window), or None. Changes nothing: the ladder takes the reason as a fact
        and recovery calls :meth:`roll_back` with its decision."""
        eff = self.effective
        if eff is None or eff.mode == "rollback" or eff.steps >= eff.rollback_steps:
            return None
        c = canonical(cls)
        if c is None or not (ROWS[c].side is Side.USER or c in _ROLLBACK_EXTRA):
            return None
        return (f"version {eff.version} failed with {c.value} {eff.steps} step(s) after "
                f"it took effect (rollback window {eff.rollback_steps})")

    def roll_back(self, reason: str, last_step: int | None, now: float) -> None:
        """Go back to the previous version after its successor's failure."""
        self._roll_back(reason, last_step, now)

    # ------------------------------------------------------------------ records
    def _save(self) -> None:
        cur = {"version": self.version.number, "previous": self.previous}
        vs.write_current(self.run_dir, cur["version"], cur["previous"],
                         staged=self.staged.to_dict() if self.staged else None)

    def _change(self, event: vs.ChangeEvent, fields: Mapping[str, object],
                now: float) -> None:
        try:
            vs.ensure_versions_dir(self.run_dir)
            vs.append_change(self.run_dir, event, fields, now)
        except OSError as exc:  # the change log is a record, never a reason to stop
            log.warning("could not append to the change log: %s", exc)

    def _incident(self, eff: Effective, fields: ResumedFields, tier: str | None,
                  now: float) -> None:
        """The change as a manual ``code_data_change`` incident (see the docstring)."""
        inc = new_incident(f"change-v{eff.version}-{int(eff.applied_at)}",
                           FailureClass.CODE_DATA_CHANGE, Category.MANUAL, eff.requested_at,
                           fault_time=eff.requested_at, nodes=[], ranks=[],
                           last_step=eff.applied_step,
                           evidence={**fields, "who": eff.who, "message": eff.message,
                                     "digest": self.version.digest})
        inc.localized_at, inc.recovered_at, inc.rung = eff.requested_at, now, Rung.IN_PLACE
        inc.restored_step, inc.restore_tier = fields["restored_step"], tier
        inc.steps_lost = fields["steps_redone"]
        self.events.incident(inc)
