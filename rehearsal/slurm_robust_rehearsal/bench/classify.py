"""``slurm-robust bench classify``: the failure classifier against the real-log corpus.

The corpus (tests/data/failure_corpus/corpus.jsonl) holds failure excerpts from public
issue trackers, each with the class and side a careful SRE assigned and the exit code or
signal the process would have had. Every entry is classified from its excerpt, its exit
status and, where its thread states that the failure came right after a change of the
job's code, data or dependencies, the launcher's change record (``change_recorded``: a
hot update, or launcher/control/env_change.py's fingerprint), by
slurm_robust.launcher.classify.classify, and compared with its labels. The figures
without the change record are reported too (``without_change_records``).

Reported: class accuracy overall and by class, the side confusion matrix
(infrastructure / user / unknown), the share of wrong infrastructure-vs-user decisions
(one side taken for the other; "unknown" on either side is not such a decision: it goes
to diagnosis), and the healthy nodes that would be evicted (user-side entries whose
decision is an eviction).

The same figures are reported for the two splits of corpus_split.py: ``development`` (the
entries classifier patterns may be written from) and ``held_out`` (chosen by a hash of the
thread URL before anyone read an entry; the figure to quote). Within each split the entries
whose ids are not in the list of ids read while the patterns were written
(tests/data/classify_seen_ids.txt) are reported again as ``not_seen``: the held-out
entries nobody tuned against, which is the honest figure while the old, read entries are
still in the held-out split.

The classifier answers with its learned fallback (launcher/classify_model.py) where the
rules find no cause; ``rules_only`` gives each split's figures without it. ``--cv``
cross-validates that fallback inside the development split (classify_train.py) and
``--train-model`` rebuilds its model file from the development split.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.launcher.classify import (
    LEARNABLE,
    Classification,
    Evidence,
    classify,
    model_features,
)
from slurm_robust.launcher.classify_model import load_model
from slurm_robust.taxonomy import CLASSES, Side
from slurm_robust_rehearsal.bench import classify_reviewers, classify_train
from slurm_robust_rehearsal.bench.corpus_split import Split, split_of
from slurm_robust_rehearsal.bench.shares import percent, share

HELP = "classifier accuracy and infrastructure/user decisions on the real-log corpus"
REPO = Path(__file__).resolve().parents[3]
CORPUS = REPO / "tests" / "data" / "failure_corpus" / "corpus.jsonl"
SEEN_IDS = REPO / "tests" / "data" / "classify_seen_ids.txt"
SIDES = tuple(s.value for s in Side)
#: Floors on the development entries the patterns were written from (tests assert them).
TARGET_CLASS_ACCURACY = 0.95
TARGET_WRONG_SIDE = 0.02
TARGET_HEALTHY_EVICTED = 0
#: The targets the classifier is held to, on the held-out split (reported in ``targets``
#: and ``met``, never asserted by a test): logs nobody tuned a pattern to.
HELD_OUT_CLASS_ACCURACY = 0.90
HELD_OUT_WRONG_SIDE = 0.05


@dataclass(frozen=True)
class Entry:
    id: str
    url: str
    cls: str
    side: str
    excerpt: str
    exit_code: int | None
    signal: int | None
    change_recorded: bool = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", type=Path, default=CORPUS,
                        help=f"corpus JSON lines (default {CORPUS.relative_to(REPO)})")
    parser.add_argument("--seen-ids", type=Path, default=SEEN_IDS,
                        help="ids read while the patterns were written (each split's "
                             "not_seen figures are the rest)")
    parser.add_argument("--misses", action="store_true",
                        help="list every misclassified entry")
    parser.add_argument("--train-model", action="store_true",
                        help="rebuild the learned fallback's model file "
                             "(slurm_robust/launcher/classify_model.json) from the "
                             "development split, and report what was written")
    parser.add_argument("--cv", action="store_true",
                        help="cross-validate the learned fallback inside the development "
                             "split (no held-out entry is read), and report only that")


def load_corpus(path: Path) -> tuple[list[Entry], list[str]]:
    """Entries, and one reason per line that could not be read (never dropped silently)."""
    if not path.is_file():
        raise UsageError(f"no corpus at {path}; pass --corpus PATH")
    entries, bad = [], []
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
            entry = Entry(str(rec["id"]), str(rec["url"]), str(rec["class"]), str(rec["side"]),
                          str(rec["excerpt"]), rec.get("exit_code"), rec.get("signal"),
                          rec.get("change_recorded") is True)
        except (ValueError, KeyError, TypeError) as exc:
            bad.append(f"line {n}: {exc}")
            continue
        if entry.cls not in CLASSES or entry.side not in SIDES:
            bad.append(f"line {n} ({entry.id}): class {entry.cls!r} or side {entry.side!r} "
                       "is not in the taxonomy")
            continue
        try:
            split_of(entry.url)
        except ValueError as exc:
            bad.append(f"line {n} ({entry.id}): {exc}")
            continue
        entries.append(entry)
    return entries, bad


def load_seen_ids(path: Path) -> set[str]:
    """Ids the classifier's patterns were written against (empty if there is no list)."""
    if not path.is_file():
        return set()
    return {line.strip() for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")}


def in_split(entries: list[Entry], split: Split) -> list[Entry]:
    return [e for e in entries if split_of(e.url) is split]


SPLIT_FIGURES = ("entries", "class_accuracy", "wrong_side_share", "wrong_side",
                 "healthy_nodes_evicted", "learned_answers")


def split_report(entries: list[Entry], seen: set[str], learned: bool = True
                 ) -> dict[str, Any]:
    """``score``'s headline figures for one split, and again for its never-read entries
    (``learned``: with the classifier's learned fallback; False: the rules alone)."""
    def figures(subset: list[Entry]) -> dict[str, Any]:
        if not subset:
            return {"entries": 0, "class_accuracy": None, "wrong_side_share": None,
                    "wrong_side": 0, "healthy_nodes_evicted": 0, "learned_answers": 0}
        scored = score(subset, learned=learned)
        return {k: scored[k] for k in SPLIT_FIGURES}
    return {**figures(entries),
            "not_seen": figures([e for e in entries if e.id not in seen])}


def classify_entry(entry: Entry, with_change: bool = True, learned: bool = True
                   ) -> Classification:
    return classify(Evidence(exit_code=entry.exit_code, signal=entry.signal,
                             log_tail=entry.excerpt,
                             change_recorded=with_change and entry.change_recorded),
                    learned=learned)


def score(entries: list[Entry], with_change: bool = True, learned: bool = True
          ) -> dict[str, Any]:
    """Accuracy, side confusion and eviction figures over ``entries`` (``with_change``:
    entries whose thread states a change come with the launcher's change record;
    ``learned``: the learned fallback answers where the rules find no cause)."""
    n = len(entries)
    by_class: dict[str, Counter[str]] = defaultdict(Counter)
    confusion = {t: dict.fromkeys(SIDES, 0) for t in SIDES}
    correct = wrong_side = evicted_healthy = learned_answers = 0
    misses = []
    for e in entries:
        c = classify_entry(e, with_change, learned)
        by_class[e.cls][c.cls] += 1
        confusion[e.side][c.side] += 1
        correct += c.cls == e.cls
        learned_answers += c.rule == "learned"
        wrong = {e.side, c.side} == {Side.INFRASTRUCTURE.value, Side.USER.value}
        wrong_side += wrong
        healthy = e.side == Side.USER.value and c.evicts
        evicted_healthy += healthy
        if c.cls != e.cls or wrong or healthy:
            misses.append({"id": e.id, "label": f"{e.cls}/{e.side}",
                           "got": f"{c.cls}/{c.side}/{c.action}", "line": c.line[:160]})
    user_n = sum(1 for e in entries if e.side == Side.USER.value)
    return {
        "entries": n,
        "class_accuracy": share(correct, n),
        "wrong_side_share": share(wrong_side, n),
        "wrong_side": wrong_side,
        "healthy_nodes_evicted": evicted_healthy,
        # answers of the learned fallback (the rules found no cause; classify_model.py)
        "learned_answers": learned_answers,
        "healthy_evicted_share": round(evicted_healthy / user_n, 4) if user_n else 0.0,
        "unknown_side_share": share(sum(v[Side.UNKNOWN.value] for v in confusion.values()), n),
        "side_confusion": {"rows": "label", "columns": "classified", **confusion},
        "by_class": {cls: {"n": sum(got.values()), "correct": got[cls],
                           "accuracy": round(got[cls] / sum(got.values()), 4),
                           "classified_as": dict(got.most_common())}
                     for cls, got in sorted(by_class.items())},
        "misses": misses,
    }


def inference_ms(entries: list[Entry]) -> dict[str, Any]:
    """What the learned fallback costs per failure: reading the words of an excerpt and
    scoring them (the model file is read once per process, ``load``)."""
    start = time.perf_counter()
    model = load_model()
    load = time.perf_counter() - start
    each = []
    for e in entries:
        start = time.perf_counter()
        model.predict(model_features(Evidence(exit_code=e.exit_code, signal=e.signal,
                                              log_tail=e.excerpt)), allowed=LEARNABLE)
        each.append(time.perf_counter() - start)
    return {"load": round(load * 1e3, 2), "mean": round(sum(each) / len(each) * 1e3, 3),
            "max": round(max(each) * 1e3, 3)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    entries, unreadable = load_corpus(args.corpus)
    if not entries:
        raise UsageError(f"no readable entry in {args.corpus}")
    if getattr(args, "train_model", False):
        return classify_train.write_model(entries)
    if getattr(args, "cv", False):
        return classify_train.cross_validate(entries, load_seen_ids(args.seen_ids))
    result = score(entries)
    # The same without the change record: what the log and exit status alone decide
    # (a change made outside `update` and before the launcher's fingerprint existed).
    bare = score(entries, with_change=False)
    result["without_change_records"] = {
        "entries_with_a_change_record": sum(e.change_recorded for e in entries),
        **{k: bare[k] for k in ("class_accuracy", "wrong_side_share",
                                "healthy_nodes_evicted")}}
    seen = load_seen_ids(args.seen_ids)
    for split in Split:
        result[split.value] = split_report(in_split(entries, split), seen)
    # The rules alone (the learned fallback off): what the fallback adds, split by split.
    result["rules_only"] = {split.value: split_report(in_split(entries, split), seen,
                                                      learned=False) for split in Split}
    # People labelling the same entries: what the excerpt decides, how far labels agree.
    result["reviewers"] = classify_reviewers.report(
        entries, {e.id: classify_entry(e) for e in entries})
    result["learned_inference_ms"] = inference_ms(entries)
    result["unreadable"] = unreadable
    if not args.misses:
        result["misses"] = len(result["misses"])
    held = result[Split.HELD_OUT.value]
    result["targets"] = {"split": Split.HELD_OUT.value,
                         "class_accuracy": HELD_OUT_CLASS_ACCURACY,
                         "wrong_side_share": HELD_OUT_WRONG_SIDE,
                         "healthy_nodes_evicted": TARGET_HEALTHY_EVICTED}
    result["met"] = bool(held["class_accuracy"] >= HELD_OUT_CLASS_ACCURACY
                         and held["wrong_side_share"] <= HELD_OUT_WRONG_SIDE
                         and all(result[s.value]["healthy_nodes_evicted"]
                                 <= TARGET_HEALTHY_EVICTED for s in Split))
    result["headline"] = headline(result)
    return result


def headline(result: dict[str, Any]) -> str:
    """The figures in one sentence, as the docs quote them (a docs test compares)."""
    parts = []
    for split in (Split.HELD_OUT, Split.DEVELOPMENT):
        s = result[split.value]
        unread = s["not_seen"]
        parts.append(f"{split.value.replace('_', '-')}: {percent(s['class_accuracy'])} of "
                     f"{s['entries']} right ({percent(unread['class_accuracy'])} of the "
                     f"{unread['entries']} never read), {percent(s['wrong_side_share'])} "
                     f"wrong side ({s['wrong_side']}), {s['healthy_nodes_evicted']} healthy "
                     "nodes evicted")
    return "; ".join(parts)
