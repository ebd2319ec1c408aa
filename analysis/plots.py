"""The report's plots, drawn with matplotlib's Agg backend into PNG bytes.

Each function takes an :class:`~slurm_robust.analysis.pipeline.Analysis` and returns the
PNG, or None when there is nothing to draw (no runs, no incidents, no nodes). Times on
the x axes are hours since the earliest run start, so several runs share one axis.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import numpy as np

from slurm_robust.analysis.taxonomy import CATEGORIES, RUNGS
from slurm_robust.vocabulary import Rung

if TYPE_CHECKING:
    from slurm_robust.analysis.pipeline import Analysis

MAX_RUNS_DRAWN = 8
MAX_POINTS = 50_000
CATEGORY_COLOURS = {"explicit": "tab:red", "implicit": "tab:orange", "manual": "tab:blue"}
RUNG_MARKERS = {Rung.IN_PLACE: "o", Rung.SPARE: "s", Rung.REQUEUE: "^", Rung.STOP: "X"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    _pyplot().close(fig)
    return buf.getvalue()


def _origin(an: Analysis) -> float:
    return float(an.spans["start"].min())


def _top_runs(an: Analysis) -> np.ndarray:
    return an.spans.sort_values("wall_s", ascending=False).index[:MAX_RUNS_DRAWN].to_numpy()


def _mark_incidents(ax: Any, an: Analysis, t0: float) -> None:
    inc = an.incidents
    for cat in CATEGORIES:
        sel = inc[inc["category"] == cat]
        if len(sel):
            xs = (sel["detected_at"].to_numpy() - t0) / 3600
            ax.vlines(xs, 0, 1, transform=ax.get_xaxis_transform(),
                      colors=CATEGORY_COLOURS[cat], linestyles=":",
                      label=f"{cat} incident", alpha=0.8)


def plot_ettr(an: Analysis) -> bytes | None:
    """Window and cumulative ETTR over time per run, incidents as dotted lines."""
    if an.sliding.empty:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    t0 = _origin(an)
    names = an.spans["run_id"]
    for run in _top_runs(an):
        sl = an.sliding[an.sliding["run"] == run]
        x = (sl["time"].to_numpy() - t0) / 3600
        label = f"{names[run]}: {an.window_s / 60:g}-min window"
        line = ax.plot(x, sl["window_ettr"], label=label)[0]
        ax.plot(x, sl["cumulative_ettr"], color=line.get_color(), linestyle="--",
                label=f"{names[run]}: cumulative")
    _mark_incidents(ax, an, t0)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("hours since first run start")
    ax.set_ylabel("ETTR")
    ax.set_title("Effective training time ratio")
    ax.legend(fontsize="small", loc="lower left")
    ax.grid(alpha=0.3)
    return _png(fig)


def plot_incident_timeline(an: Analysis) -> bytes | None:
    """Incidents over time, one row per class, coloured by category, shaped by rung."""
    inc = an.incidents
    if inc.empty:
        return None
    plt = _pyplot()
    classes = [c for c in inc["class"].cat.categories if (inc["class"] == c).any()]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.4 * len(classes)))
    t0 = _origin(an)
    row = {c: i for i, c in enumerate(classes)}
    for rung in RUNGS:
        sel = inc[inc["rung"] == rung]
        if sel.empty:
            continue
        colours = [CATEGORY_COLOURS.get(c, "grey") for c in sel["category"].astype(str)]
        ax.scatter((sel["detected_at"] - t0) / 3600, sel["class"].astype(str).map(row),
                   c=colours, marker=RUNG_MARKERS[rung], s=60, label=rung, edgecolors="k")
    ax.set_yticks(range(len(classes)), classes)
    ax.set_xlabel("hours since first run start (detection time)")
    ax.set_title("Incidents by class (colour: category, marker: resolution)")
    ax.legend(title="resolution", fontsize="small")
    ax.grid(alpha=0.3)
    return _png(fig)


def plot_step_time(an: Analysis) -> bytes | None:
    """Step time over the run; step records undone by a later rollback in grey."""
    if an.steps.empty:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    t0 = _origin(an)
    names = an.spans["run_id"]
    steps = an.steps[an.steps["run_id"].cat.codes.isin(_top_runs(an))]
    if len(steps) > MAX_POINTS:
        steps = steps.iloc[:: len(steps) // MAX_POINTS + 1]
    for code, sel in steps.groupby(steps["run_id"].cat.codes, sort=True):
        kept = sel[sel["kept"]]
        ax.plot((kept["time"] - t0) / 3600, kept["step_time_s"], ".", markersize=3,
                label=f"{names[code]}")
    redone = steps[~steps["kept"]]
    if len(redone):
        ax.plot((redone["time"] - t0) / 3600, redone["step_time_s"], "x", color="grey",
                label="undone by a rollback (lost)")
    _mark_incidents(ax, an, t0)
    ax.set_ylim(bottom=0, top=max(float(steps["step_time_s"].max()) * 1.2, 1e-3))
    ax.set_xlabel("hours since first run start")
    ax.set_ylabel("step time (s)")
    ax.set_title("Step time")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return _png(fig)


def plot_recovery_by_class(an: Analysis) -> bytes | None:
    """Mean detect + localize + recover time per class, stacked; max recover as a dot."""
    inc = an.incidents
    if inc.empty:
        return None
    plt = _pyplot()
    g = inc.groupby("class", observed=True)
    detect = g["time_to_detect"].mean().fillna(0)
    localize = g["time_to_localize"].mean().fillna(0)
    rest = (g["time_to_recover"].mean() - localize).clip(lower=0).fillna(0)
    worst = (inc["time_to_detect"].fillna(0) + inc["time_to_recover"]).groupby(
        inc["class"], observed=True).max()
    labels = [str(c) for c in detect.index]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * len(labels)))
    y = np.arange(len(labels))
    ax.barh(y, detect, color="tab:gray", label="detect (mean)")
    ax.barh(y, localize, left=detect, color="tab:purple", label="localize (mean)")
    ax.barh(y, rest, left=detect + localize, color="tab:green", label="restart to 1st step")
    ax.plot(worst.reindex(detect.index), y, "k|", markersize=14,
            label="worst incident: fault to 1st step")
    ax.set_yticks(y, labels)
    ax.set_xlabel("seconds from fault")
    ax.set_title("Time to recover by incident class")
    ax.legend(fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def plot_node_blame(an: Analysis, top: int = 20) -> bytes | None:
    """Per-node incidents blamed, drains and failed check runs (top nodes)."""
    nodes = an.nodes
    cols = ["incidents_blamed", "drains", "check_runs_failed"]
    nodes = nodes[nodes[cols].sum(axis=1) > 0].head(top)
    if nodes.empty:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.4 * len(nodes)))
    y = np.arange(len(nodes))
    h = 0.27
    for i, (col, colour) in enumerate(zip(cols, ("tab:red", "tab:blue", "tab:orange"),
                                          strict=True)):
        ax.barh(y + (i - 1) * h, nodes[col], height=h, color=colour, label=col)
    names = [f"{n} *" if off else str(n) for n, off in
             zip(nodes.index, nodes["repeat_offender"], strict=True)]
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("count (* = repeat offender)")
    ax.set_title("Per-node blame")
    ax.legend(fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


PLOTS = {
    "ettr": ("ETTR over time", plot_ettr),
    "incidents": ("Incident timeline", plot_incident_timeline),
    "step_time": ("Step time", plot_step_time),
    "recovery": ("Recovery time by class", plot_recovery_by_class),
    "nodes": ("Per-node blame", plot_node_blame),
}


def draw_all(an: Analysis) -> dict[str, tuple[str, bytes]]:
    """Every plot that has data: name -> (title, PNG bytes)."""
    out: dict[str, tuple[str, bytes]] = {}
    for name, (title, fn) in PLOTS.items():
        png = fn(an)
        if png is not None:
            out[name] = (title, png)
    return out
