"""The messages between workers, agents and the controller, as typed dataclasses.

The wire stays what it was (JSON objects, see protocol.py): ``to_json`` gives the dict,
``from_json`` checks it at the boundary and raises :class:`BadMessage`, one exception
with the field and the reason, for anything malformed or unexpected (a missing field, a
wrong type, an unknown message or progress kind). Keys a newer peer adds are ignored,
so one side can be updated before the other.

- :class:`Progress`: one line of a worker's progress file (``kind`` step, restored,
  final or anomaly), with the agent's ``rank`` added.
- :class:`WorkerExit`: a worker's end as its agent saw it; a failure carries the
  classification (``class`` on the wire), a success only ``exit_code`` 0.
- :class:`Finding`: one in-job monitor finding (node/monitor.py) on the agent's node.
- :class:`NodeSample`: the monitor's latest implicit readings (GPU use, SM clock,
  network traffic) of the agent's node.
- :class:`DiagnosisReport`: the outcome of a stop-time diagnosis the plan asked for.
- :class:`Report`: what an agent sends every ``heartbeat_s`` (``op`` "report").
- :class:`Plan`: the agent's whole desired state, as the controller decided it.
- :class:`Reply`: the controller's answer to a report: the plan in full with its
  identity, or "unchanged" when the agent already holds the current plan.
- :class:`Incident`: the incident record of docs/SCHEMAS.md (field order included).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, NotRequired, TypedDict, TypeVar

from slurm_robust.launcher import rank_map
from slurm_robust.launcher.enums import (
    Category,
    ProgressKind,
    Role,
    Rung,
    Severity,
    WorkPhase,
)
from slurm_robust.launcher.wire_records import DiagnosisEvidence, ExitEvidence
from slurm_robust.taxonomy import Action, Side

T = TypeVar("T", bound="Message")

#: Longest plan identity a report or reply may name (control/replies.py makes ones of
#: about 40 characters).
MAX_PLAN_ID = 128


class BadMessage(ValueError):
    """A message refused at the boundary: malformed or unexpected."""


@dataclass(frozen=True)
class WireForm:
    """A field written on the wire in another form than it has in memory (a field's
    ``wire_form`` metadata): ``write`` makes the wire value, ``read`` checks it and makes
    the field's value back, raising ValueError for a malformed one."""

    write: Callable[[Any], Any]
    read: Callable[[Any], Any]


#: Plan.rank_nodes on the wire: compact runs (launcher/rank_map.py), not a name per rank.
RANK_MAP_FORM = WireForm(write=rank_map.encode, read=rank_map.decode)


#: List items checked by their exact type first (what json.loads makes; anything else,
#: a subclass, takes the item-by-item path): a long list costs one set of types instead
#: of a Python call per item (32,768 strings: 0.6 ms instead of 15).
_EXACT_ITEM_TYPES: dict[Any, frozenset[type]] = {
    str: frozenset({str}), int: frozenset({int}), float: frozenset({int, float}),
    bool: frozenset({bool})}


Check = Callable[[Any], bool]
Convert = Callable[[Any, str], Any]


# The check and the conversion of each type hint are built once per hint (closures over
# what the hint says) instead of reading the hint with typing.get_origin on every value:
# a 4,096-agent controller decodes about 7,000 progress lines a second, and reading the
# hints was 70 % of its CPU (bench scale, cProfile).
@functools.cache
def _checker(hint: Any) -> Check:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        parts = tuple(_checker(arg) for arg in typing.get_args(hint))
        if len(parts) == 2 and type(None) in typing.get_args(hint):
            other = parts[0] if typing.get_args(hint)[1] is type(None) else parts[1]
            return lambda v: v is None or other(v)
        return lambda v: any(p(v) for p in parts)
    if hint is Any:
        return lambda v: True
    if hint is type(None):
        return lambda v: v is None
    if hint is bool:
        return lambda v: isinstance(v, bool)
    if hint is int:
        return lambda v: isinstance(v, int) and not isinstance(v, bool)
    if hint is float:
        return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    if origin is list:
        (item,) = typing.get_args(hint)
        exact = _EXACT_ITEM_TYPES.get(item)
        item_ok = _checker(item)
        return lambda v: isinstance(v, list) and (
            (exact is not None and set(map(type, v)) <= exact) or all(map(item_ok, v)))
    if origin is dict:
        key_ok, value_ok = (_checker(arg) for arg in typing.get_args(hint))
        return lambda v: isinstance(v, dict) and all(key_ok(k) and value_ok(x)
                                                     for k, x in v.items())
    if typing.is_typeddict(hint):
        # A record's keys are documented, not checked here: its reader reads what it needs.
        return lambda v: isinstance(v, dict)
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        members = hint._value2member_map_
        return lambda v: isinstance(v, str) and v in members
    if isinstance(hint, type) and issubclass(hint, Message):
        return lambda v: isinstance(v, dict)
    if isinstance(hint, type):
        return lambda v: isinstance(v, hint)
    return lambda v: False


def _same(value: Any, where: str) -> Any:
    return value


@functools.cache
def _converter(hint: Any) -> Convert:
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    # What each alternative of the hint does to a value, in order; the first that
    # applies decides (a list or a message always applies, an enum to a str, a float
    # to an int).
    steps: list[tuple[str, Any]] = []
    for arg in typing.get_args(hint) if union else (hint,):
        if typing.get_origin(arg) is list:
            (item,) = typing.get_args(arg)
            message_items = isinstance(item, type) and issubclass(item, Message)
            steps.append(("messages" if message_items else "list", item))
            break
        if isinstance(arg, type) and issubclass(arg, StrEnum):
            steps.append(("enum", arg))
        elif isinstance(arg, type) and issubclass(arg, Message):
            steps.append(("message", arg))
            break
        elif arg is float:
            steps.append(("float", arg))
    if not steps:
        return _same

    def convert(value: Any, where: str) -> Any:
        if value is None:
            return None
        for kind, arg in steps:
            if kind == "messages":
                return [arg.from_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
            if kind == "list":
                return list(value)
            if kind == "message":
                return arg.from_json(value, where)
            if kind == "enum" and isinstance(value, str):
                return arg(value)
            if kind == "float" and isinstance(value, int):
                return float(value)
        return value

    return convert


def _to_wire(value: Any) -> Any:
    if isinstance(value, Message):
        return value.to_json()
    if isinstance(value, list):
        return [_to_wire(v) for v in value]
    if isinstance(value, StrEnum):
        return value.value
    return value


@dataclass
class Message:
    """Shared ``to_json``/``from_json``: one field per wire key (``wire`` metadata renames
    a field whose key is a Python keyword); a field without a default is required."""

    #: Keys a message of this kind must not hold None in, beyond the type hints.
    NAME: ClassVar[str] = "message"
    #: Fields left out of ``to_json`` while they hold their default (a lean wire).
    LEAN: ClassVar[bool] = False

    @classmethod
    def from_json(cls: type[T], raw: Any, where: str | None = None) -> T:
        where = where or cls.NAME
        if not isinstance(raw, Mapping):
            raise BadMessage(f"{where}: expected a JSON object, got {type(raw).__name__}")
        # open-ended: the keyword arguments of whichever message class decodes here
        values: dict[str, Any] = {}
        for name, key, required, hint, form, check, convert in _wire_fields(cls):
            if key not in raw:
                if required:
                    raise BadMessage(f"{where}: missing field {key!r}")
                continue
            value = raw[key]
            if form is not None and value is not None:
                try:
                    values[name] = form.read(value)
                except ValueError as exc:
                    raise BadMessage(f"{where}: field {key!r}: {exc}") from None
                continue
            if not check(value):
                raise BadMessage(f"{where}: field {key!r} has {value!r:.80}, expected "
                                 f"{_hint_name(hint)}")
            values[name] = value if convert is _same else convert(value, f"{where}.{key}")
        obj = cls(**values)
        obj.validate(where)
        return obj

    def validate(self, where: str) -> None:
        """Checks across fields (a subclass adds its own)."""

    # open-ended: shared by every message kind; each kind's fields are its keys
    def to_json(self) -> dict[str, Any]:
        return self.to_json_with(None)

    # open-ended: as to_json
    def to_json_with(self, stand_in: Mapping[str, Any] | None) -> dict[str, Any]:
        """``to_json``, with ``stand_in`` (field name -> wire value) written for those
        fields instead of their own values (control/replies.py writes a plan's rank map
        once for thousands of plans and splices it in)."""
        out: dict[str, Any] = {}  # open-ended: as to_json
        for f, name, key, form in _out_fields(type(self)):
            value = getattr(self, name)
            if not self._on_wire(f, value):
                continue
            if stand_in is not None and name in stand_in:
                out[key] = stand_in[name]
            elif form is not None and value is not None:
                out[key] = form.write(value)
            else:
                out[key] = _to_wire(value)
        return out

    def _on_wire(self, f: dataclasses.Field[Any], value: object) -> bool:
        """Whether ``to_json`` writes this field (a kind leaves some out)."""
        return not (self.LEAN and _is_default(f, value))


@functools.cache
def _out_fields(cls: type[Message]) -> tuple[
        tuple[dataclasses.Field[Any], str, str, WireForm | None], ...]:
    """Each field of a message class as (field, name, wire key, wire form or None), for
    ``to_json``: computed once per class, as ``_wire_fields`` is for decoding (a push
    of a decision encodes thousands of plans in a row)."""
    return tuple((f, f.name, f.metadata.get("wire", f.name), f.metadata.get("wire_form"))
                 for f in dataclasses.fields(cls))


@functools.cache
def _wire_fields(cls: type[Message]) -> tuple[
        tuple[str, str, bool, Any, WireForm | None, Check, Convert], ...]:
    """Each field of a message class as (name, wire key, required, resolved type hint,
    its wire form or None, its type check, its conversion).

    Computed once per class: ``typing.get_type_hints`` evaluates every annotation string
    on each call, and was two thirds of the controller's cost per report when it ran for
    every message decoded."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, f.metadata.get("wire", f.name),
                  f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
                  hints[f.name], f.metadata.get("wire_form"), _checker(hints[f.name]),
                  _converter(hints[f.name]))
                 for f in dataclasses.fields(cls))


def _is_default(f: dataclasses.Field[Any], value: object) -> bool:
    if f.default is not dataclasses.MISSING:
        return bool(value == f.default)
    if f.default_factory is not dataclasses.MISSING:
        return bool(value == f.default_factory())
    return False


def _hint_name(hint: Any) -> str:
    return str(hint).replace("typing.", "").replace("slurm_robust.launcher.", "")


#: A section's name keys its learned durations in state.json: bounded.
SECTION_NAME_MAX = 64


@dataclass
class Progress(Message):
    """One progress line of a worker (``rank`` added by its agent); keys other than the
    ones below (an anomaly's ``what``, ...) travel in ``extra``."""

    NAME: ClassVar[str] = "progress"

    rank: int
    kind: ProgressKind = ProgressKind.STEP
    step: int | None = None
    t: float | None = None
    loss: float | None = None
    grad_norm: float | None = None
    busy_s: Any = None  # checked by control/failslow.busy_of: a bad value is ignored there
    tier: str | None = None
    params_sha256: str | None = None
    # The phase the worker is in from this line on (a ``phase`` line; None: ``steps``)
    # and, for a user section, its name.
    phase: WorkPhase | None = None
    section: str | None = None
    # open-ended: whatever else the training script wrote on the line
    extra: dict[str, Any] = field(default_factory=dict)

    KNOWN: ClassVar[frozenset[str]] = frozenset(
        {"rank", "kind", "step", "t", "loss", "grad_norm", "busy_s", "tier", "params_sha256",
         "phase", "section"})

    @classmethod
    def from_json(cls, raw: Any, where: str | None = None) -> Progress:
        obj = super().from_json(raw, where)
        obj.extra = {k: v for k, v in raw.items() if k not in cls.KNOWN and k != "extra"}
        return obj

    def validate(self, where: str) -> None:
        if self.kind is ProgressKind.STEP and self.step is None:
            raise BadMessage(f"{where}: a step line needs 'step'")
        if self.section is not None and not 0 < len(self.section) <= SECTION_NAME_MAX:
            raise BadMessage(f"{where}: a section name must have 1..{SECTION_NAME_MAX} "
                             "characters")

    # open-ended: the line as the worker wrote it, extra keys included
    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in super().to_json().items() if k != "extra"}
        out = {k: v for k, v in out.items() if v is not None}
        return {**self.extra, **out}


#: What a successful worker exit carries on the wire.
_SUCCESS_FIELDS = frozenset({"rank", "gen", "exit_code", "signal", "time"})


@dataclass
class WorkerExit(Message):
    """A worker's end; ``exit_code`` 0 is a success, anything else a failure that
    carries the classification (``class`` on the wire)."""

    NAME: ClassVar[str] = "exit"

    rank: int
    gen: int
    exit_code: int | None
    signal: int | None
    time: float
    cls: str | None = field(default=None, metadata={"wire": "class"})
    category: Category | None = None
    secondary: bool = False
    signature: str | None = None
    line: str | None = None
    evidence: ExitEvidence = field(default_factory=ExitEvidence)
    log: str | None = None
    # Whose fault the classifier thinks it is and its first response (slurm_robust.taxonomy);
    # optional on the wire so an older agent's report still reads (recovery then takes the
    # class's default from the taxonomy).
    side: Side | None = None
    action: Action | None = None

    def validate(self, where: str) -> None:
        if self.exit_code != 0 and (self.cls is None or self.category is None):
            raise BadMessage(f"{where}: a failed worker's exit needs 'class' and 'category'")
        if self.action is Action.EVICT and self.side is not None and \
                self.side is not Side.INFRASTRUCTURE:
            raise BadMessage(f"{where}: action 'evict' needs side 'infrastructure', "
                             f"got {self.side.value!r}")

    def _on_wire(self, f: dataclasses.Field[Any], value: object) -> bool:
        # A success is the exit alone: no classification to carry.
        return self.exit_code != 0 or f.name in _SUCCESS_FIELDS


@dataclass
class Finding(Message):
    """A non-ok result of the in-job monitor: which check (``kind`` is its schedule:
    gpu, kernel, network, host), how bad, why, with the check's evidence and the
    incident class a fatal one is handled as."""

    NAME: ClassVar[str] = "finding"

    kind: str
    check: str
    severity: Severity
    reason: str
    time: float
    cls: str | None = field(default=None, metadata={"wire": "class"})
    # open-ended: each check writes its own evidence (slurm_robust.health checks)
    evidence: dict[str, Any] = field(default_factory=dict)

    def validate(self, where: str) -> None:
        if self.severity is Severity.FATAL and not self.cls:
            raise BadMessage(f"{where}: a fatal finding needs 'class'")
        if not self.check or not self.kind:
            raise BadMessage(f"{where}: a finding needs 'kind' and 'check'")


@dataclass
class NodeSample(Message):
    """The monitor's implicit readings of a node (None: not readable there)."""

    NAME: ClassVar[str] = "sample"

    time: float
    gpu_util: float | None = None
    sm_clock_mhz: float | None = None
    net_bytes_per_s: float | None = None
    #: RDMA data through the node's InfiniBand/RoCE ports (port_xmit_data + port_rcv_data,
    #: which count 4-byte words); None on a node without such ports.
    rdma_bytes_per_s: float | None = None


@dataclass
class DiagnosisReport(Message):
    """A stop-time diagnosis (launcher/diagnose.py) the agent ran because its plan asked
    (``Plan.diagnose`` holds the same ``id``); ``evidence`` is ``Diagnosis.evidence()``."""

    NAME: ClassVar[str] = "diagnosis"

    id: str
    node: str
    passed: bool
    complete: bool
    elapsed_s: float
    reason: str = ""
    # Empty only from an agent that sent none (the wire allows it).
    evidence: DiagnosisEvidence = field(default_factory=dict)

    def validate(self, where: str) -> None:
        if self.elapsed_s < 0:
            raise BadMessage(f"{where}: 'elapsed_s' must be >= 0, got {self.elapsed_s}")
        if not self.passed and not self.reason:
            raise BadMessage(f"{where}: a failed diagnosis needs a 'reason'")


@dataclass
class Report(Message):
    """An agent's report (also its heartbeat)."""

    NAME: ClassVar[str] = "report"

    op: str
    agent: int
    node: str
    pid: int
    key: str
    time: float
    addr: str | None = None
    gen: int = -1
    role: Role = Role.NEW
    exits: list[WorkerExit] = field(default_factory=list)
    progress: list[Progress] = field(default_factory=list)
    states: dict[str, str | None] = field(default_factory=dict)
    # Capture id -> wire_records.StackSummary; the controller only asks which are done.
    # open-ended: the agent's summaries, unchecked at the boundary (values are not read)
    stacks: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    sample: NodeSample | None = None
    diagnoses: list[DiagnosisReport] = field(default_factory=list)
    # The newest controller term the agent has seen: a controller that reads a
    # newer term than its own stands down.
    term: int = 0
    # When the agent got Slurm's time-limit warning signal (None: not yet).
    warned: float | None = None
    # When the agent got SIGTERM: Slurm is ending the allocation (a requeue, a
    # preemption, a cancel, the time limit's kill); None: not yet.
    ending: float | None = None
    # The identity of the plan the agent holds (Reply.plan_id). Absent: it holds none, or
    # it does not know plan identities; either way the answer carries the full plan.
    plan_id: str | None = None

    def validate(self, where: str) -> None:
        if self.op != "report":
            raise BadMessage(f"{where}: unknown message kind {self.op!r} (expected 'report')")
        if self.plan_id is not None and not 0 < len(self.plan_id) <= MAX_PLAN_ID:
            raise BadMessage(f"{where}: 'plan_id' must be 1-{MAX_PLAN_ID} characters")

    def _on_wire(self, f: dataclasses.Field[Any], value: object) -> bool:
        # The monitor's fields only when they carry something: older controllers and the
        # documented wire stay as they were for agents without findings. ``term``
        # (controller failover) only once a controller term is known.
        if f.name in ("findings", "term"):
            return bool(value)
        if f.name in ("sample", "warned", "ending", "plan_id"):
            return value is not None
        return True


@dataclass
class Plan(Message):
    """The controller's answer: the agent's whole desired state (empty: none yet)."""

    NAME: ClassVar[str] = "plan"
    LEAN: ClassVar[bool] = True

    role: Role
    gen: int | None = None
    attempt: int | None = None
    world_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    # The node of every rank; on the wire "rank_map", compact runs (launcher/rank_map.py).
    rank_nodes: list[str] | None = field(
        default=None, metadata={"wire": "rank_map", "wire_form": RANK_MAP_FORM})
    run_id: str | None = None
    max_restarts: int | None = None
    slot: int | None = None
    ranks: list[int] | None = None
    stacks: str | None = None
    exit_code: int | None = None
    purge: bool = False
    diagnose: str | None = None  # a diagnosis id: run launcher/diagnose.py on this node
    # The controller term that made this plan: an agent ignores a plan from a
    # term older than one it has seen (an old controller that came back).
    term: int | None = None
    # Hot update: the code version's worker command and environment (None:
    # the run config's), its number, and whether it follows a recorded change.
    command: list[str] | None = None
    env: dict[str, str] | None = None
    code_version: int | None = None
    code_change: bool = False
    # Report again after this many seconds instead of the heartbeat (None: the
    # heartbeat). Set only while a transition is imminent (a hot update waiting for its
    # step boundary, a failure settling in a run of up to a few hundred agents), so that
    # the controller hears every agent within it rather than within a heartbeat (a
    # changed plan itself is pushed, not polled for).
    poll_s: float | None = None
    # The generation this plan replaces ends by choice (a hot update at a step
    # boundary): let its workers finish their snapshots for up to this many seconds
    # before they are stopped (worker_signals.py). None: stop them at once.
    drain_s: float | None = None

    def validate(self, where: str) -> None:
        if self.poll_s is not None and not 0 < self.poll_s <= 60:
            raise BadMessage(f"{where}: poll_s {self.poll_s} is not in (0, 60]")
        if self.drain_s is not None and not 0 < self.drain_s <= 60:
            raise BadMessage(f"{where}: drain_s {self.drain_s} is not in (0, 60]")
        if self.role is Role.EXIT:
            return
        if self.gen is None:
            raise BadMessage(f"{where}: a {self.role.value} plan needs 'gen'")
        if self.role is Role.ACTIVE:
            # Named as on the wire (rank_nodes travels as "rank_map"): the reader of the
            # refusal has the message, not this class.
            missing = ["rank_map" if k == "rank_nodes" else k
                       for k in ("world_size", "master_addr", "master_port", "rank_nodes",
                                 "slot", "ranks", "attempt") if getattr(self, k) is None]
            if missing:
                raise BadMessage(f"{where}: an active plan lacks {missing}")


@dataclass
class Reply(Message):
    """The controller's answer to a report.

    In full (``unchanged`` False): ``{"plan": {...}, "plan_id": "..."}``; an empty plan
    (``{}``, None here) has no identity. Unchanged: ``{"unchanged": true, "plan_id":
    "..."}``, sent only to a report whose ``plan_id`` is the identity of the plan the
    controller would send now; the agent goes on with the plan it holds under that
    identity. Pushed: the full form with ``"push": true``, unasked (protocol.py). A
    plan identity names the controller incarnation that issued it (control/replies.py),
    so no other controller, a successor after failover included, can answer "unchanged"
    to it. A report without ``plan_id`` always gets the plan in
    full: that is how an agent asks for it, and how an older agent stays served.
    """

    NAME: ClassVar[str] = "reply"

    plan: Plan | None = None
    plan_id: str | None = None
    unchanged: bool = False
    #: Sent unasked, when the agent's plan changed (``"push": true``, always in full):
    #: the agent applies it without reporting first (protocol.py).
    push: bool = False

    @classmethod
    def from_json(cls, raw: Any, where: str | None = None) -> Reply:
        where = where or cls.NAME
        if not isinstance(raw, Mapping):
            raise BadMessage(f"{where}: expected a JSON object, got {type(raw).__name__}")
        plan_id = raw.get("plan_id")
        if plan_id is not None and (not isinstance(plan_id, str) or not plan_id
                                    or len(plan_id) > MAX_PLAN_ID):
            raise BadMessage(f"{where}: field 'plan_id' has {plan_id!r:.80}, expected a "
                             f"string of 1-{MAX_PLAN_ID} characters")
        unchanged = raw.get("unchanged", False)
        if not isinstance(unchanged, bool):
            raise BadMessage(f"{where}: field 'unchanged' has {unchanged!r:.80}, "
                             "expected a bool")
        push = raw.get("push", False)
        if not isinstance(push, bool):
            raise BadMessage(f"{where}: field 'push' has {push!r:.80}, expected a bool")
        if unchanged:
            if plan_id is None or "plan" in raw or push:
                raise BadMessage(f"{where}: an 'unchanged' reply names a 'plan_id' and "
                                 "carries no 'plan' (and is never pushed)")
            return cls(plan_id=plan_id, unchanged=True)
        if "plan" not in raw:
            raise BadMessage(f"{where}: expected an object with 'plan'")
        plan = Plan.from_json(raw["plan"]) if raw["plan"] else None
        if plan is None and plan_id is not None:
            raise BadMessage(f"{where}: an empty plan has no 'plan_id'")
        if push and plan_id is None:
            raise BadMessage(f"{where}: a pushed plan names its 'plan_id'")
        return cls(plan=plan, plan_id=plan_id, push=push)

    # open-ended: Message.to_json's signature; the two forms are the docstring's
    def to_json(self) -> dict[str, Any]:
        if self.unchanged:
            return {"unchanged": True, "plan_id": self.plan_id}
        plan = self.plan.to_json() if self.plan is not None else {}
        named = {} if self.plan_id is None else {"plan_id": self.plan_id}
        return {"plan": plan, **named, **({"push": True} if self.push else {})}


def plan_from_reply(raw: Any) -> Plan | None:
    """The plan in a controller's reply ``{"plan": {...}}``; None for an empty plan."""
    if not isinstance(raw, Mapping) or "plan" not in raw:
        raise BadMessage("reply: expected an object with 'plan'")
    return Plan.from_json(raw["plan"]) if raw["plan"] else None


# Functional form: "class" is a keyword.
IncidentRecord = TypedDict("IncidentRecord", {
    "incident": str, "category": str, "class": str, "fault_time": float | None,
    "detected_at": float, "localized_at": float | None, "recovered_at": float | None,
    "rung": str | None, "nodes": list[str], "ranks": list[int], "last_step": int | None,
    "restored_step": int | None, "restore_tier": str | None, "steps_lost": int | None,
    # open-ended: each detector and rung adds its own keys (docs/SCHEMAS.md, incidents)
    "evidence": dict[str, Any]})
"""An incident as the event log records it (docs/SCHEMAS.md), in the documented order."""


class IncidentState(IncidentRecord):
    """An incident as ``state.json`` keeps an open one: the record, plus the incidents it
    cut short while it carries any (``Incident.to_json``)."""

    _cut_short: NotRequired[list[IncidentState]]


@dataclass
class Incident(Message):
    """An incident record (docs/SCHEMAS.md); ``to_json`` keeps the documented order."""

    NAME: ClassVar[str] = "incident"

    incident: str
    category: Category
    cls: str = field(metadata={"wire": "class"})
    fault_time: float | None
    detected_at: float
    localized_at: float | None = None
    recovered_at: float | None = None
    rung: Rung | None = None
    nodes: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    last_step: int | None = None
    restored_step: int | None = None
    restore_tier: str | None = None
    steps_lost: int | None = 0
    # open-ended: each detector and rung adds its own keys (docs/SCHEMAS.md, incidents)
    evidence: dict[str, Any] = field(default_factory=dict)
    #: Earlier incidents this one cut short (control/accounting.py): they ride inside it,
    #: in ``state.json`` too, until it recovers; then each is written before it.
    cut_short: list[Incident] = field(default_factory=list,
                                      metadata={"wire": "_cut_short"})

    def _on_wire(self, f: dataclasses.Field[Any], value: object) -> bool:
        # ``to_json`` is the record plus ``_cut_short`` while it carries earlier incidents
        # (the form ``state.json`` keeps an open incident in).
        return f.name != "cut_short" or bool(value)

    def state(self) -> IncidentState:
        """``to_json`` with its keys said: the record, then ``_cut_short`` if any."""
        out: IncidentState = {**self.record()}
        if self.cut_short:
            out["_cut_short"] = [earlier.state() for earlier in self.cut_short]
        return out

    def record(self) -> IncidentRecord:
        """The event log's incident record: the documented fields, in their order."""
        return {"incident": self.incident, "category": _to_wire(self.category),
                "class": self.cls, "fault_time": self.fault_time,
                "detected_at": self.detected_at, "localized_at": self.localized_at,
                "recovered_at": self.recovered_at, "rung": _to_wire(self.rung),
                "nodes": _to_wire(self.nodes), "ranks": _to_wire(self.ranks),
                "last_step": self.last_step, "restored_step": self.restored_step,
                "restore_tier": self.restore_tier, "steps_lost": self.steps_lost,
                "evidence": self.evidence}
