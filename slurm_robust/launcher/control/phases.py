"""Hang limits per phase, learned from the durations this run has shown.

A worker says what it is doing with ``phase`` progress lines (slurm_robust.train's
``run.section(name)``, the Lightning and Hugging Face callbacks around evaluation and
saves): a one-minute evaluation is not a hang of half-second steps, and one limit for the
whole run had to be either too short for the evaluation or too long to notice a stopped
step. Each phase gets its own limit:

- ``startup`` (a started group before its first step): ``margin`` x the p95 of the
  timed start-ups, at least ``startup_timeout_s``. Learning only raises it: start-ups
  differ too much (an in-place restart with warm processes takes seconds, the first
  allocation after a requeue loads and compiles from cold) for a short one to be
  evidence against a long one;
- ``steps``: ``steps_factor`` x the p95 step time, at least ``steps_floor_s``, once the
  group did ``STEPS_WARMUP`` steps and that many step times are known (before that,
  today's rule: max(hang floor, hang factor x median)). The p95 is capped at
  ``steps_spread_cap`` x the median: with the 20-odd step times a short run has, the
  p95 is its slowest step, and one 3.1 s step among 0.5 s ones (a loaded node, a
  collection pause) made the limit 15.5 s on the mini-cluster; a step far slower than
  its run's median that is regular work belongs in a section;
- ``eval``, ``save`` and each user section (``section:NAME``): ``unseen_s`` until one
  was timed, then ``margin`` x the p95 of its durations, at least ``floor_s``;
- ``finishing`` (past the last step): ``finishing_s``.

An explicit limit (``--hang-limit PHASE=S``; ``section`` covers every user section)
replaces the learned one. A run whose workers never declared a phase (the auto-steps
shim, scripts that write their own step lines) keeps the single rule
(policy.is_hung): its evaluations and saves are invisible, so a short step limit would
call them hangs.

Durations are observed for the group: a phase episode runs from the first rank entering
it to the last one leaving it. They live in ``RunState.phase_times`` (state.json), so a
restart or a requeue starts with what the run learned. Pure: the caller passes the time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurm_robust.launcher.control.generation import Generation, HangLimit
from slurm_robust.launcher.control.policy import hang_timeout
from slurm_robust.launcher.enums import WorkPhase
from slurm_robust.launcher.messages import Progress

STARTUP, STEPS, EVAL, SAVE = (WorkPhase.STARTUP.value, WorkPhase.STEPS.value,
                              WorkPhase.EVAL.value, WorkPhase.SAVE.value)
FINISHING, SECTION = WorkPhase.FINISHING.value, WorkPhase.SECTION.value
SECTION_PREFIX = "section:"
#: The keys ``--hang-limit`` accepts besides ``section:NAME``.
OVERRIDE_KEYS = (STARTUP, STEPS, EVAL, SAVE, SECTION, FINISHING)
#: Durations kept per phase (the newest), and phases kept per run: the names come from
#: the training script, state.json must stay small whatever it declares.
KEEP_PER_PHASE = 64
KEEP_PHASES = 32
#: Steps a group finishes, and step times known, before the learned step limit applies:
#: a restarted process's first steps are slower (allocator, autotuning, DDP buckets).
STEPS_WARMUP = 5
QUANTILE = 0.95


@dataclass(frozen=True)
class PhaseRules:
    """The defaults; docs/USER_GUIDE.md says why each is what it is."""

    steps_floor_s: float = 3.0
    steps_factor: float = 5.0
    steps_spread_cap: float = 3.0
    floor_s: float = 30.0
    margin: float = 3.0
    unseen_s: float = 1800.0
    finishing_s: float = 300.0


RULES = PhaseRules()


def phase_key(phase: WorkPhase | None, section: str | None) -> str:
    """The key a phase line's durations and limit go by."""
    if phase is None:
        return STEPS
    if phase is WorkPhase.SECTION:
        return SECTION_PREFIX + section if section else SECTION
    return phase.value


def quantile(values: Sequence[float], q: float = QUANTILE) -> float | None:
    """Nearest-rank quantile of the finite values (None when there are none)."""
    vals = sorted(v for v in values if math.isfinite(v))
    if not vals:
        return None
    return vals[min(len(vals) - 1, max(0, math.ceil(q * len(vals)) - 1))]


def observe(book: dict[str, list[float]], key: str, duration: float) -> None:
    """Keep ``duration`` for ``key`` (bounded: see KEEP_PER_PHASE, KEEP_PHASES)."""
    if not math.isfinite(duration) or duration < 0:
        return
    if key not in book and len(book) >= KEEP_PHASES:
        # The oldest user section makes room; the built-in phases always stay.
        victims = [k for k in book if k.startswith(SECTION_PREFIX)]
        if not victims:
            return
        del book[victims[0]]
    values = book.setdefault(key, [])
    values.append(round(duration, 3))
    del values[:-KEEP_PER_PHASE]


def limit_of(key: str, book: Mapping[str, Sequence[float]], overrides: Mapping[str, float],
             startup_timeout_s: float, rules: PhaseRules = RULES) -> float:
    """The limit of phase ``key`` (for ``steps``: the warm limit, see steps_limit)."""
    if key in overrides:
        return overrides[key]
    if key.startswith(SECTION_PREFIX) and SECTION in overrides:
        return overrides[SECTION]
    seen = quantile(book.get(key, ())[-KEEP_PER_PHASE:])
    if key == STEPS:
        if seen is None:
            return rules.steps_floor_s
        median = quantile(book[key][-KEEP_PER_PHASE:], 0.5) or seen
        return max(rules.steps_floor_s,
                   rules.steps_factor * min(seen, rules.steps_spread_cap * median))
    if key == FINISHING:
        return rules.finishing_s
    if key == STARTUP:
        return startup_timeout_s if seen is None else \
            max(startup_timeout_s, rules.margin * seen)
    return rules.unseen_s if seen is None else max(rules.floor_s, rules.margin * seen)


def steps_limit(gen: Generation, book: Mapping[str, Sequence[float]],
                overrides: Mapping[str, float], legacy_steps: Sequence[float],
                floor_s: float, factor: float, rules: PhaseRules = RULES) -> float:
    """The steady-step limit: learned once the group is warm, else today's rule."""
    if STEPS in overrides:
        return overrides[STEPS]
    if gen.steps_done < STEPS_WARMUP or len(book.get(STEPS, ())) < STEPS_WARMUP:
        return hang_timeout(legacy_steps, floor_s, factor)
    return limit_of(STEPS, book, overrides, 0.0, rules)


def current_keys(gen: Generation, reports_steps: bool = True) -> set[str]:
    """The phases the group's ranks are in now (a rank that said nothing: the default,
    ``startup`` before the group's first step, else ``steps``). For a script that never
    reported a step the default is left out while any rank is in a declared phase: it
    has no step limit to compete with the phase's."""
    default = STEPS if gen.steps_done else STARTUP
    keys = {k for k, n in gen.phase_counts.items() if n > 0 and k != STEPS}
    if gen.finishing:
        keys.add(FINISHING)
    if reports_steps or not keys:
        keys.add(default)
    return keys


def group_limit(gen: Generation, book: Mapping[str, Sequence[float]],
                overrides: Mapping[str, float], startup_timeout_s: float,
                legacy_steps: Sequence[float], floor_s: float, factor: float,
                reports_steps: bool = True, rules: PhaseRules = RULES) -> HangLimit:
    """The most lenient limit among the phases the ranks are in: a rank that saves
    alone holds the others at the next collective, and they are not hung."""
    best: HangLimit | None = None
    for key in sorted(current_keys(gen, reports_steps)):
        if key == STEPS:
            limit = steps_limit(gen, book, overrides, legacy_steps, floor_s, factor, rules)
        else:
            limit = limit_of(key, book, overrides, startup_timeout_s, rules)
        if best is None or limit > best["limit_s"]:
            best = {"phase": key, "limit_s": round(limit, 3)}
    assert best is not None  # current_keys is never empty
    return best


def on_phase_line(gen: Generation, item: Progress, now: float,
                  book: dict[str, list[float]]) -> None:
    """A rank entered a phase: its previous phase's episode may end (timed into
    ``book`` once no rank is left in it); the change counts as progress."""
    key = phase_key(item.phase, item.section)
    prev = gen.rank_phase.get(item.rank, STEPS)
    if prev == key:
        return
    if prev != STEPS:
        gen.phase_counts[prev] -= 1
        if gen.phase_counts[prev] <= 0:
            del gen.phase_counts[prev]
            began = gen.phase_began.pop(prev, None)
            if began is not None:
                observe(book, prev, now - began)
    if key == STEPS:
        gen.rank_phase.pop(item.rank, None)
    else:
        gen.rank_phase[item.rank] = key
        gen.phase_counts[key] = gen.phase_counts.get(key, 0) + 1
        gen.phase_began.setdefault(key, now)
    # The step that ends after this holds the phase's time: it is no step time.
    gen.phase_moved = True
    gen.last_progress = max(gen.last_progress, now)


def on_step(gen: Generation, step_time: float | None, now: float,
            book: dict[str, list[float]]) -> None:
    """A step every rank finished: the group's start-up (its first step) or one step
    time, unless a phase began or ended since the step before."""
    if gen.steps_done == 1:
        observe(book, STARTUP, now - gen.started_at)
    elif step_time is not None and not gen.phase_moved:
        observe(book, STEPS, step_time)
    gen.phase_moved = False


def limits_table(book: Mapping[str, Sequence[float]], overrides: Mapping[str, float],
                 startup_timeout_s: float, rules: PhaseRules = RULES) -> dict[str, float]:
    """Every known phase's limit now (``steps``: once warm), for state.json and
    ``slurm-robust status``."""
    keys = [STARTUP, STEPS, EVAL, SAVE, FINISHING]
    keys += sorted(k for k in {*book, *overrides} if k not in keys)
    return {k: round(limit_of(k, book, overrides, startup_timeout_s, rules), 3)
            for k in keys}


def parse_overrides(items: Sequence[str]) -> dict[str, float]:
    """``--hang-limit PHASE=S`` values into a dict; raises ValueError with the fix."""
    out: dict[str, float] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not (key in OVERRIDE_KEYS or (key.startswith(SECTION_PREFIX)
                                                    and len(key) > len(SECTION_PREFIX))):
            raise ValueError(f"--hang-limit {item!r}: use PHASE=SECONDS with PHASE one of "
                             f"{', '.join(OVERRIDE_KEYS)} or section:NAME")
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"--hang-limit {item!r}: {text!r} is not a number of "
                             "seconds") from None
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"--hang-limit {item!r}: use a positive number of seconds")
        out[key] = value
    return out
