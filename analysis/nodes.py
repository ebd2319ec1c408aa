"""Per-node view: incidents blamed, health-check failures, drains, time drained.

Per node (a row for every node that appears in any input):

- ``incidents_blamed``: distinct incidents (run, incident id) whose ``nodes`` name it
- ``verdicts``: verdict records against it
- ``checks_failed``: health records with status ``fail``; ``check_runs_failed``: distinct
  suite runs (``run_id``) with at least one failed check
- ``drains``: node events of kind drain/down/fail (sacctmgr events, ``sinfo -R``)
- ``time_drained_s``: their summed length inside ``[since, until]``; an open event
  counts up to ``until`` (default: now)
- ``repeat_offender``: the node was named by at least ``threshold`` (default 2) separate
  faults by one of the three independent sources: incidents blamed, drains, or failed
  suite runs. The sources overlap (an incident usually ends in a drain), so we take the
  largest of the three rather than their sum, to avoid counting one fault twice.
"""

from __future__ import annotations

import time as _time

import numpy as np
import pandas as pd

DRAIN_KINDS = ("drain", "down", "fail")
REPEAT_THRESHOLD = 2


def _count(series: pd.Series, name: str) -> pd.Series:
    return series.astype(object).value_counts().rename(name)


def node_table(incidents: pd.DataFrame, verdicts: pd.DataFrame, health: pd.DataFrame,
               node_events: pd.DataFrame, since: float | None = None,
               until: float | None = None, threshold: int = REPEAT_THRESHOLD,
               ) -> pd.DataFrame:
    """One row per node (index ``node``), sorted most-blamed first."""
    until = _time.time() if until is None else until
    blamed = incidents[["run_id", "incident", "nodes"]].explode("nodes").dropna(subset=["nodes"])
    blamed = blamed.drop_duplicates()
    parts = [_count(blamed["nodes"], "incidents_blamed"),
             _count(verdicts["node"], "verdicts")]
    fails = health[health["status"] == "fail"]
    parts.append(_count(fails["node"], "checks_failed"))
    runs = fails[["node", "run_id"]].astype(object).drop_duplicates()
    parts.append(_count(runs["node"], "check_runs_failed"))
    ev = node_events[node_events["node"].notna() & node_events["kind"].isin(DRAIN_KINDS)]
    lo = ev["start"].clip(lower=since) if since is not None else ev["start"]
    hi = ev["end"].fillna(until).clip(upper=until)
    length = (hi - lo).clip(lower=0.0)
    parts.append(_count(ev["node"], "drains"))
    parts.append(length.groupby(ev["node"].astype(object)).sum().rename("time_drained_s"))
    table = pd.concat(parts, axis=1).fillna(0)
    for col in ("incidents_blamed", "verdicts", "checks_failed", "check_runs_failed",
                "drains"):
        table[col] = table[col].astype("int64") if col in table else 0
    table["time_drained_s"] = table.get("time_drained_s", 0.0)
    score = np.maximum.reduce([table["incidents_blamed"], table["drains"],
                               table["check_runs_failed"]]) if len(table) else []
    table["repeat_offender"] = pd.Series(score, index=table.index, dtype="int64") >= threshold
    table.index.name = "node"
    return table.sort_values(["incidents_blamed", "drains", "checks_failed"],
                             ascending=False, kind="stable")


def repeat_offenders(table: pd.DataFrame) -> list[str]:
    """Names of the repeat offenders in a :func:`node_table`."""
    return [str(n) for n in table.index[table["repeat_offender"]]]


#: How many of the most-blamed nodes the concentration table looks at.
CONCENTRATION_TOP = (1, 3, 10)


def blame_concentration(incidents: pd.DataFrame,
                        top: tuple[int, ...] = CONCENTRATION_TOP) -> pd.DataFrame:
    """The fleet view of blame: what share of the incidents that named a node the ``k``
    most-blamed nodes account for, for each ``k`` in ``top`` (up to the nodes named).

    Columns: ``top_nodes`` (k), ``nodes`` (their names, most blamed first),
    ``runs_blaming`` (distinct runs, i.e. jobs, that blamed one of them: the node
    ledger's lemon rule counts distinct jobs too), ``incidents`` (distinct incidents
    naming at least one of them) and ``share`` of all incidents naming any node. A few
    nodes with a large share are the lemons to look at (``slurm-robust node lemons``).
    """
    cols = ["top_nodes", "nodes", "runs_blaming", "incidents", "share"]
    blamed = incidents[["run_id", "incident", "nodes"]].explode("nodes").dropna(subset=["nodes"])
    blamed = blamed.astype(object).drop_duplicates()
    if blamed.empty:
        return pd.DataFrame(columns=cols)
    blamed["key"] = list(zip(blamed["run_id"], blamed["incident"], strict=True))
    total = blamed["key"].nunique()
    per_node = blamed.groupby("nodes")["key"].nunique()
    order = sorted(per_node.index, key=lambda n: (-per_node[n], str(n)))
    rows = []
    for k in sorted({min(k, len(order)) for k in top if k >= 1}):
        names = order[:k]
        hit = blamed[blamed["nodes"].isin(names)]
        n = hit["key"].nunique()
        rows.append({"top_nodes": k, "nodes": ",".join(map(str, names)),
                     "runs_blaming": int(hit["run_id"].nunique()), "incidents": int(n),
                     "share": round(n / total, 4)})
    return pd.DataFrame(rows, columns=cols)
