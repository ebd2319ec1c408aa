"""Write the post-mortem: report.md, a self-contained report.html and the plots.

report.html embeds its PNGs as base64 data URIs, so it can be mailed or attached to an
issue as one file; report.md links the PNGs written beside it (``plots/*.png``);
headline.json holds :meth:`Analysis.headline`.
"""

from __future__ import annotations

import base64
import html
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from slurm_robust.analysis.nan import nan_by_resolution
from slurm_robust.analysis.nodes import blame_concentration
from slurm_robust.analysis.pipeline import Analysis
from slurm_robust.analysis.plots import draw_all
from slurm_robust.records import write_json_atomic

INCIDENT_COLUMNS = ["run_id", "incident", "category", "class", "rung", "nodes",
                    "time_to_detect", "time_to_localize", "time_to_recover", "steps_lost",
                    "steps_redone", "lost_time_s"]
MAX_ROWS = 200


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.3f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, list):
        return ",".join(map(str, value))
    if value is None or value is pd.NA:
        return "-"
    return str(value)


def _rows(df: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    df = df.head(MAX_ROWS)
    return [str(c) for c in df.columns], [[_fmt(v) for v in row] for row in
                                         df.itertuples(index=False, name=None)]


def md_table(df: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (at most MAX_ROWS rows)."""
    if df.empty:
        return "_none_\n"
    head, rows = _rows(df)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def html_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "<p><em>none</em></p>"
    head, rows = _rows(df)
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def sections(an: Analysis) -> list[tuple[str, str, pd.DataFrame | None]]:
    """(title, explanation, table) in report order."""
    head = an.headline()
    summary = pd.DataFrame(
        [(k, json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in head.items()
         if k not in ("unread", "fleet")], columns=["figure", "value"])
    out: list[tuple[str, str, pd.DataFrame | None]] = [
        ("Summary", "ETTR = productive time / wall time; productive time is the time of "
         "steps that were kept (steps redone after a rollback are not productive).", summary),
        ("ETTR per run", "A run whose script reports no steps has no ETTR (its "
         "productive time is unknown): it reads \"no step reports\".", _per_run(an)),
        ("Allocations", "Each Slurm allocation of a run (attempt): a run longer than its "
         "time limit, preempted or requeued is a chain of them. ended_by: the class of the "
         "incident that requeued it (requeue: none was logged), or the run's end; "
         "boundary_s: its last step record to the next allocation's first (queue wait "
         "included); steps_redone: its last step minus the next one's restored step.",
         an.allocations),
        ("Incidents by category", "", an.by_category),
        ("Incidents by class", "ByteRobust Table 1 taxonomy; times in seconds.", an.by_class),
        ("Incidents by resolution", "in_place restart, spare node, requeue, stop.", an.by_rung),
        ("NaN incidents by resolution", "The NaN ladder: reattempt (restore and replay), "
         "rollback (it moved: suspected SDC), skip or stop (it came back: data or model), "
         "replay, evict (bitwise test); mean seconds per stage.",
         nan_by_resolution(an.incidents)),
        ("Incidents", "", an.incidents[[c for c in INCIDENT_COLUMNS
                                        if c in an.incidents.columns]]),
        ("Nodes", "Repeat offender: named by >= 2 separate faults by one source.",
         an.nodes.reset_index()),
        ("Blame concentration", "Share of the incidents that named a node accounted for by "
         "the most-blamed nodes; runs_blaming counts distinct runs (jobs), as the node "
         "ledger's lemon rule does (slurm-robust node lemons).",
         blame_concentration(an.incidents)),
    ]
    if an.findings is not None and len(an.findings):
        out.append(("In-job monitor findings", "What each node's monitor saw while the job "
                    "ran; before_incident names the incident on the same node that "
                    "followed (within 10 minutes) and how long after.", an.findings))
    if an.control_plane is not None and len(an.control_plane):
        out.append(("Control plane", "Controller takeovers (a successor's term, its node and the "
                    "agent whose controller it replaced) and overloads (the controller's tick loop "
                    "late by lag_s at worst; that time was not counted against any agent, so "
                    "no node was blamed for it).", an.control_plane))
    if an.fleet is not None:
        fleet = pd.DataFrame(list(an.fleet.headline().items()), columns=["figure", "value"])
        out += [("Fleet (sacct)", "", fleet),
                ("Lost job records by cause", "", an.fleet.by_cause)]
    unread = an.issues.as_dict()
    out.append(("Unread input", "Lines and records the loaders could not use (counted, "
                "never silently dropped).",
                pd.DataFrame([(k, json.dumps(v)) for k, v in unread.items()],
                             columns=["what", "count"])))
    return out


def _per_run(an: Analysis) -> pd.DataFrame:
    per_run = an.per_run.copy()
    if "step_reports" in per_run:
        per_run["ettr"] = [("no step reports" if n == 0 else e)
                           for e, n in zip(per_run["ettr"], per_run["step_reports"],
                                           strict=True)]
    return per_run


def _period(an: Analysis) -> str:
    def iso(t: float | None) -> str:
        return "-" if t is None else datetime.fromtimestamp(t, UTC).isoformat()
    if an.since is None and an.until is None:
        return "period: every record read"
    return f"period: {iso(an.since)} .. {iso(an.until)} (UTC)"


def write_report(an: Analysis, out_dir: str | Path, title: str = "slurm_robust post-mortem",
                 ) -> dict[str, Path]:
    """Write report.md, report.html, headline.json and plots/*.png; returns their paths."""
    out = Path(out_dir)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    plots = draw_all(an)
    for name, (_, png) in plots.items():
        (out / "plots" / f"{name}.png").write_bytes(png)
    secs = sections(an)
    md = [f"# {title}\n", f"_{_period(an)}_\n"]
    for name, (ptitle, _) in plots.items():
        md.append(f"![{ptitle}](plots/{name}.png)\n")
    for stitle, text, table in secs:
        md.append(f"## {stitle}\n")
        if text:
            md.append(text + "\n")
        if table is not None:
            md.append(md_table(table))
    paths = {"md": out / "report.md", "html": out / "report.html",
             "json": out / "headline.json"}
    paths["md"].write_text("\n".join(md))
    paths["html"].write_text(_html(title, an, secs, plots))
    write_json_atomic(paths["json"], an.headline())
    return paths


_CSS = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:0.85em}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}"
        "th{background:#eee}img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}")


def _html(title: str, an: Analysis, secs: list[tuple[str, str, pd.DataFrame | None]],
          plots: dict[str, tuple[str, bytes]]) -> str:
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
             f"</title><style>{_CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1><p><em>{html.escape(_period(an))}</em></p>"]
    for ptitle, png in plots.values():
        data = base64.b64encode(png).decode()
        parts.append(f"<h3>{html.escape(ptitle)}</h3>"
                     f"<img alt='{html.escape(ptitle)}' src='data:image/png;base64,{data}'>")
    for stitle, text, table in secs:
        parts.append(f"<h2>{html.escape(stitle)}</h2>")
        if text:
            parts.append(f"<p>{html.escape(text)}</p>")
        if table is not None:
            parts.append(html_table(table))
    parts.append("</body></html>")
    return "\n".join(parts)
