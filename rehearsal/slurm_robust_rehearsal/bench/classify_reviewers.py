"""The classifier beside people labelling the same corpus entries: what the evidence it
reads can decide at all, and how far two readers of a thread agree.

Two label files sit beside the corpus (tests/data/failure_corpus/, schemas in its
README):

- ``excerpt_only_labels.jsonl``: a reviewer's class and side for a sample of entries, from
  exactly what the classifier reads (the excerpt, the exit status, the change record; no
  thread, no code), with ``decided``: whether the excerpt decides the class or the
  reviewer had to choose between classes. The reviewer's accuracy against the thread's
  label is the ceiling of any classifier of the excerpt; the classifier's accuracy on the
  decided and undecided entries says where its misses are.
- ``thread_relabels.jsonl``: a second reader's class and side for a sample, from the
  thread, without seeing the corpus's labels: how far the labels themselves agree.

Only aggregates per split are reported (no entry's answer), so held-out entries stay
unread by whoever writes patterns.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.launcher.classify import Classification
from slurm_robust.taxonomy import CLASSES, Side
from slurm_robust_rehearsal.bench.corpus_split import Split, split_of
from slurm_robust_rehearsal.bench.shares import percent, share

CORPUS_DIR = Path(__file__).resolve().parents[3] / "tests" / "data" / "failure_corpus"
EXCERPT_ONLY = CORPUS_DIR / "excerpt_only_labels.jsonl"
THREAD_RELABELS = CORPUS_DIR / "thread_relabels.jsonl"
LABELS_VERSION = 1
SIDES = frozenset(s.value for s in Side)


def load_labels(path: Path, known_ids: set[str], flag: str) -> dict[str, dict[str, Any]]:
    """A label file's rows by entry id; UsageError naming the file and line for a row
    that is not a label of a corpus entry (``flag``: the row's boolean field)."""
    rows: dict[str, dict[str, Any]] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            ok = (isinstance(row, dict) and row.get("v") == LABELS_VERSION
                  and row.get("id") in known_ids and row.get("class") in CLASSES
                  and row.get("side") in SIDES and isinstance(row.get(flag), bool))
        except ValueError:
            ok = False
        if not ok or row["id"] in rows:
            raise UsageError(f"{path}:{n}: not a label row (v {LABELS_VERSION}, a corpus id "
                             f"once, a class, a side, {flag} true/false)")
        rows[row["id"]] = row
    return rows


def excerpt_only(entries: Sequence[Any], answers: dict[str, Classification],
                 labels: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per split: the reviewer's and the classifier's class accuracy on the reviewed
    entries, and both again on the entries the excerpt decides and on the rest."""
    tally: Counter[tuple[str, str, str]] = Counter()
    for e in entries:
        row = labels.get(e.id)
        if row is None:
            continue
        group = "decided" if row["decided"] else "undecided"
        for split in (split_of(e.url).value, "all"):
            for g in ("all", group):
                tally[split, g, "n"] += 1
                tally[split, g, "reviewer"] += row["class"] == e.cls
                tally[split, g, "classifier"] += answers[e.id].cls == e.cls
    return {split: {g: {"entries": tally[split, g, "n"],
                        "reviewer": share(tally[split, g, "reviewer"], tally[split, g, "n"]),
                        "classifier": share(tally[split, g, "classifier"],
                                             tally[split, g, "n"])}
                    for g in ("all", "decided", "undecided")}
            for split in (*(s.value for s in Split), "all")}


def thread_relabel(entries: Sequence[Any], labels: dict[str, dict[str, Any]]
                   ) -> dict[str, Any]:
    """Per split: how often a second reader of the thread gave the corpus's class, and
    its side where both named one (infrastructure or user)."""
    tally: Counter[tuple[str, str]] = Counter()
    for e in entries:
        row = labels.get(e.id)
        if row is None:
            continue
        for split in (split_of(e.url).value, "all"):
            tally[split, "n"] += 1
            tally[split, "class"] += row["class"] == e.cls
            tally[split, "found"] += row["found"]
            named = {row["side"], e.side} <= {Side.INFRASTRUCTURE.value, Side.USER.value}
            tally[split, "sides_named"] += named
            tally[split, "side"] += named and row["side"] == e.side
    return {split: {"entries": tally[split, "n"], "threads_found": tally[split, "found"],
                    "class_agreement": share(tally[split, "class"], tally[split, "n"]),
                    "side_agreement": share(tally[split, "side"],
                                             tally[split, "sides_named"])}
            for split in (*(s.value for s in Split), "all")}


def report(entries: Sequence[Any], answers: dict[str, Classification]) -> dict[str, Any]:
    """Both comparisons (each only where its label file exists), and ``line``: the
    sentence the docs quote."""
    ids = {e.id for e in entries}
    out: dict[str, Any] = {}
    if EXCERPT_ONLY.exists():
        out["excerpt_only"] = excerpt_only(
            entries, answers, load_labels(EXCERPT_ONLY, ids, "decided"))
    if THREAD_RELABELS.exists():
        out["thread_relabel"] = thread_relabel(
            entries, load_labels(THREAD_RELABELS, ids, "found"))
    out["line"] = line(out)
    return out


def line(rep: dict[str, Any]) -> str:
    parts = []
    if "excerpt_only" in rep:
        held = rep["excerpt_only"][Split.HELD_OUT.value]
        parts.append(
            f"on {held['all']['entries']} held-out entries a reviewer labelling from the "
            f"excerpt alone scores {percent(held['all']['reviewer'])} and the classifier "
            f"{percent(held['all']['classifier'])}; on the {held['decided']['entries']} the "
            f"excerpt decides, the classifier {percent(held['decided']['classifier'])}, on the "
            f"{held['undecided']['entries']} it does not, "
            f"{percent(held['undecided']['classifier'])} (the reviewer "
            f"{percent(held['undecided']['reviewer'])})")
    if "thread_relabel" in rep:
        both = rep["thread_relabel"]["all"]
        parts.append(
            f"a second reader of {both['entries']} threads gives the corpus's class for "
            f"{percent(both['class_agreement'])} and its side for "
            f"{percent(both['side_agreement'])} of those where both name one")
    return "; ".join(parts)
