"""Pure parsers for Slurm's own records: sacct, ``sacctmgr show event``, ``sinfo -R``.

They take the text the commands print and return typed frames plus a count of lines that
could not be parsed (never dropped silently, never fatal). :mod:`fetch` runs the commands
through ``slurm_robust.slurm``; tests feed recorded output to these functions.

Times: Slurm prints local time as ``YYYY-MM-DDTHH:MM:SS`` (or Unix seconds when
``SLURM_TIME_FORMAT=%s``); both parse to Unix seconds (float, NaN for ``Unknown``/``None``).
Free text (JobName, Reason) may contain ``|``; whichever free-text field comes LAST in
the line absorbs extra separators, so fetch requests those fields last.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import Any

import numpy as np
import pandas as pd

from slurm_robust.analysis.frames import as_category

# The fields fetch asks sacct for, free text last.
SACCT_FIELDS: tuple[str, ...] = (
    "JobID", "JobIDRaw", "Partition", "State", "ExitCode", "NNodes", "NodeList",
    "Submit", "Start", "End", "ElapsedRaw", "JobName")
EVENT_FIELDS: tuple[str, ...] = ("NodeName", "Start", "End", "State", "User", "Reason")

# Job states Slurm may print, in the order the report lists them.
JOB_STATES: tuple[str, ...] = (
    "COMPLETED", "FAILED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "CANCELLED",
    "PREEMPTED", "REQUEUED", "BOOT_FAIL", "DEADLINE", "RUNNING", "PENDING", "SUSPENDED",
    "RESIZING", "REVOKED")

_ISO = "%Y-%m-%dT%H:%M:%S"


@dataclass
class Parsed:
    """A parsed frame and how many non-empty lines did not fit the header."""

    frame: pd.DataFrame
    malformed: int = 0
    example: str = ""


def _local_tz() -> tzinfo:
    tz = datetime.now().astimezone().tzinfo
    assert tz is not None  # astimezone() always sets one
    return tz


def parse_times(values: pd.Series, tz: tzinfo | None = None) -> pd.Series:
    """Slurm time strings (ISO local time or Unix seconds) -> float Unix seconds."""
    values = values.astype("string")
    numeric = pd.to_numeric(values, errors="coerce").astype("float64")
    todo = numeric.isna() & values.notna()
    if todo.any():
        dt = pd.to_datetime(values[todo], format=_ISO, errors="coerce")
        dt = dt.dt.tz_localize(tz or _local_tz(), ambiguous="NaT", nonexistent="NaT")
        secs = (dt - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)
        numeric.loc[todo] = secs.astype("float64")
    return numeric


def split_parsable(text: str, fields: Sequence[str] | None = None) -> Parsed:
    """Split ``--parsable2`` text into string columns.

    With ``fields`` None the first line is the header. Lines with fewer fields than the
    header are malformed; extra ``|`` go into the last field.
    """
    lines = pd.Series([ln for ln in text.splitlines() if ln.strip()], dtype=object)
    if fields is None:
        if lines.empty:
            return Parsed(pd.DataFrame())
        fields = str(lines.iloc[0]).split("|")
        lines = lines.iloc[1:].reset_index(drop=True)
    n = len(fields)
    if lines.empty:
        return Parsed(pd.DataFrame({f: pd.Series(dtype="string") for f in fields}))
    lines = lines.astype("string")
    ok = lines.str.count(r"\|") >= n - 1
    bad = int((~ok).sum())
    example = str(lines[~ok].iloc[0])[:200] if bad else ""
    parts = lines[ok].str.split("|", n=n - 1, expand=True)
    parts.columns = list(fields)[:parts.shape[1]]
    for f in fields:
        if f not in parts.columns:
            parts[f] = pd.Series(pd.NA, index=parts.index, dtype="string")
    return Parsed(parts.reset_index(drop=True).astype("string"), bad, example)


def _col(frame: pd.DataFrame, name: str) -> pd.Series:
    if name in frame.columns:
        return frame[name]
    return pd.Series(pd.NA, index=frame.index, dtype="string")


def _exit_parts(codes: pd.Series) -> tuple[pd.Series, pd.Series]:
    parts = codes.str.extract(r"^(\d+):(\d+)$")
    return (pd.to_numeric(parts[0], errors="coerce").astype("Int64"),
            pd.to_numeric(parts[1], errors="coerce").astype("Int64"))


def parse_sacct(text: str, fields: Sequence[str] | None = None,
                tz: tzinfo | None = None) -> tuple[Parsed, Parsed]:
    """Parse ``sacct --parsable2`` (optionally ``--duplicates``) into (jobs, steps).

    jobs: one row per job record (a requeued job has one row per run; see
    :func:`collapse_requeues`); steps: one row per step (``123.batch``, ``123.0``).
    Columns: job_id, job_raw, step (steps only), name, partition, state, exit_code,
    signal, nnodes, node_list, submit, start, end, elapsed_s.
    """
    split = split_parsable(text, fields)
    raw = split.frame
    if raw.empty:
        raw = pd.DataFrame({f: pd.Series(dtype="string") for f in SACCT_FIELDS})
    jobid = _col(raw, "JobID")
    valid = jobid.notna() & (jobid.str.len() > 0) & _col(raw, "State").notna()
    bad = split.malformed + int((~valid).sum())
    raw = raw[valid].reset_index(drop=True)
    jobid = raw["JobID"]
    exit_code, signal = _exit_parts(_col(raw, "ExitCode"))
    state = _col(raw, "State").str.split(" ", n=1).str[0].str.rstrip("+")
    times = {k: parse_times(_col(raw, src), tz)
             for k, src in (("submit", "Submit"), ("start", "Start"), ("end", "End"))}
    elapsed = pd.to_numeric(_col(raw, "ElapsedRaw"), errors="coerce").astype("float64")
    frame = pd.DataFrame({
        "job_id": jobid.str.split(".", n=1).str[0],
        "job_raw": _col(raw, "JobIDRaw").str.split(".", n=1).str[0],
        "step": jobid.str.split(".", n=1).str[1],
        "name": _col(raw, "JobName"),
        "partition": as_category(_col(raw, "Partition").astype(object)),
        "state": as_category(state.astype(object), JOB_STATES),
        "exit_code": exit_code, "signal": signal,
        "nnodes": pd.to_numeric(_col(raw, "NNodes"), errors="coerce").astype("Int64"),
        "node_list": as_category(_col(raw, "NodeList").astype(object)),
        **times, "elapsed_s": elapsed})
    frame["job_raw"] = frame["job_raw"].fillna(frame["job_id"])
    is_step = frame["step"].notna()
    jobs = frame[~is_step].drop(columns="step").reset_index(drop=True)
    steps = frame[is_step].reset_index(drop=True)
    example = split.example or ("line without JobID/State" if bad else "")
    return Parsed(jobs, bad, example), Parsed(steps, 0)


def collapse_requeues(jobs: pd.DataFrame) -> pd.DataFrame:
    """One row per job: its last record, with ``restarts`` = earlier records of that job.

    ``sacct --duplicates`` lists a requeued job once per run (earlier ones in state
    REQUEUED or NODE_FAIL/PREEMPTED); without ``--duplicates`` restarts are all 0.
    """
    repeated = jobs["job_raw"].duplicated(keep=False).to_numpy()
    if not repeated.any():
        return jobs.assign(restarts=np.zeros(len(jobs), dtype=np.int64)).reset_index(drop=True)
    once = jobs[~repeated].assign(restarts=np.zeros(int((~repeated).sum()), dtype=np.int64))
    order = jobs[repeated].sort_values(["job_raw", "submit", "start"], kind="stable",
                                       na_position="first")
    last = order.drop_duplicates("job_raw", keep="last")
    counts = order.groupby("job_raw", sort=False, observed=True).size()
    last = last.assign(restarts=last["job_raw"].map(counts).astype("int64") - 1)
    return pd.concat([once, last], ignore_index=True)


def parse_sacct_json(text: str) -> Parsed:
    """Parse ``sacct --json`` (22.05 layout) into the job frame of :func:`parse_sacct`.

    Each job entry that lacks ``job_id`` or ``state.current`` is counted as malformed.
    """
    try:
        doc = json.loads(text)
    except ValueError:
        return Parsed(parse_sacct("")[0].frame, 1, "not JSON")
    entries = doc.get("jobs", []) if isinstance(doc, dict) else []
    rows: list[dict[str, Any]] = []
    bad = 0
    for job in entries:
        row = _json_job_row(job)
        if row is None:
            bad += 1
        else:
            rows.append(row)
    lines = ["|".join(SACCT_FIELDS)] + ["|".join(str(r.get(f, "")) for f in SACCT_FIELDS)
                                        for r in rows]
    jobs, _ = parse_sacct("\n".join(lines))
    return Parsed(jobs.frame, bad + jobs.malformed, "job entry without job_id/state" if bad else "")


def _json_job_row(job: Any) -> dict[str, Any] | None:
    if not isinstance(job, dict) or "job_id" not in job:
        return None
    state = job.get("state", {})
    current = state.get("current") if isinstance(state, dict) else None
    if not isinstance(current, str):
        return None
    ex = job.get("exit_code", {}) if isinstance(job.get("exit_code"), dict) else {}
    sig = ex.get("signal", {}) if isinstance(ex.get("signal"), dict) else {}
    t = job.get("time", {}) if isinstance(job.get("time"), dict) else {}
    alloc = job.get("allocation_nodes", "")
    return {"JobID": job["job_id"], "JobIDRaw": job["job_id"],
            "Partition": job.get("partition", ""), "State": current,
            "ExitCode": f"{ex.get('return_code', 0)}:{sig.get('signal_id', 0)}",
            "NNodes": alloc, "NodeList": job.get("nodes", ""),
            "Submit": t.get("submission", ""), "Start": t.get("start", ""),
            "End": t.get("end", ""), "ElapsedRaw": t.get("elapsed", ""),
            "JobName": str(job.get("name", "")).replace("\n", " ")}


def _node_event_kind(states: pd.Series) -> pd.Series:
    up = states.fillna("").str.upper()
    kind = np.select([up.str.contains("DRAIN"), up.str.contains("DOWN"),
                      up.str.contains("FAIL")], ["drain", "down", "fail"], "other")
    return as_category(pd.Series(kind, index=states.index, dtype=object),
                       ("drain", "down", "fail", "other"))


def parse_node_events(text: str, fields: Sequence[str] | None = EVENT_FIELDS,
                      tz: tzinfo | None = None) -> Parsed:
    """Parse ``sacctmgr -P -n show event format=...`` into node events.

    Columns: node, start, end (NaN while the event is open), state, kind
    (drain/down/fail/other), user, reason, source. Cluster events (no node name) are
    kept with node NA; node metrics ignore them.
    """
    split = split_parsable(text, fields)
    raw = split.frame.rename(columns={"TimeStart": "Start", "TimeEnd": "End"})
    node = _col(raw, "NodeName").replace("", pd.NA) if not raw.empty else _col(raw, "NodeName")
    frame = pd.DataFrame({
        "node": as_category(node.astype(object)),
        "start": parse_times(_col(raw, "Start"), tz),
        "end": parse_times(_col(raw, "End"), tz),
        "state": _col(raw, "State"),
        "kind": _node_event_kind(_col(raw, "State")),
        "user": _col(raw, "User"),
        "reason": _col(raw, "Reason"),
        "source": as_category(pd.Series("sacctmgr", index=raw.index, dtype=object))})
    no_start = frame["start"].isna()
    bad = split.malformed + int(no_start.sum())
    return Parsed(frame[~no_start].reset_index(drop=True), bad,
                  split.example or ("event without a start time" if no_start.any() else ""))


def parse_sinfo_reasons(text: str, tz: tzinfo | None = None) -> Parsed:
    """Parse ``sinfo -R -h -N -o '%N|%T|%E|%u|%H'`` lines into open node events.

    The reason may contain ``|``: the first two fields are read from the left and the
    last two from the right. Columns as :func:`parse_node_events`, with ``end`` NaN.
    """
    rows: list[tuple[str, str, str, str, str]] = []
    bad, example = 0, ""
    for line in text.splitlines():
        if not line.strip():
            continue
        head = line.split("|", 2)
        tail = head[2].rsplit("|", 2) if len(head) == 3 else []
        if len(tail) != 3 or not head[0].strip():
            bad += 1
            example = example or line[:200]
            continue
        rows.append((head[0].strip(), head[1], tail[0], tail[1], tail[2]))
    raw = pd.DataFrame(rows, columns=["node", "state", "reason", "user", "ts"],
                       dtype="string")
    frame = pd.DataFrame({
        "node": as_category(raw["node"].astype(object)),
        "start": parse_times(raw["ts"], tz),
        "end": pd.Series(np.nan, index=raw.index),
        "state": raw["state"],
        "kind": _node_event_kind(raw["state"]),
        "user": raw["user"], "reason": raw["reason"],
        "source": as_category(pd.Series("sinfo", index=raw.index, dtype=object))})
    return Parsed(frame, bad, example)


def merge_node_events(events: pd.DataFrame, reasons: pd.DataFrame) -> pd.DataFrame:
    """Add ``sinfo -R`` reasons not already open in the accounting events (same node)."""
    if reasons.empty:
        return events
    if events.empty:
        return reasons
    open_nodes = set(events.loc[events["end"].isna(), "node"].dropna().astype(str))
    extra = reasons[~reasons["node"].astype(str).isin(open_nodes)]
    out = pd.concat([events.astype({"node": object, "kind": object, "source": object}),
                     extra.astype({"node": object, "kind": object, "source": object})],
                    ignore_index=True)
    return out.assign(node=as_category(out["node"]),
                      kind=as_category(out["kind"], ("drain", "down", "fail", "other")),
                      source=as_category(out["source"]))
