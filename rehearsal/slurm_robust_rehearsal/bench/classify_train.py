"""Train the classifier's learned fallback (slurm_robust/launcher/classify_model.json) from
the failure corpus's development split, and cross-validate it inside that split.

Training reads development entries only (corpus_split.py decides; held-out entries are
dropped before anything else is done with them), is deterministic (entries sorted by id,
full-batch gradient descent from zero for a fixed number of steps) and writes a JSON file
that names the split, the number of entries and a hash of their ids, so a test can check
that the shipped file is what the corpus trains today.

The model: softmax regression over word presence (classify_model.features), the feature
vector divided by the square root of its length, a small L2 penalty. numpy only: the
corpus is a few hundred entries and the model a few thousand words, which an ML library
would not train better, and the controller must not depend on one to read the result.

Cross-validation (``bench classify --cv``): the development entries in k folds (a seeded
permutation), each fold classified by the rules plus a model trained on the other folds,
repeated over a few seeds. Reported: the model alone, the rules alone and the rules with
the fallback, on all development entries, on the never-read ones, and on the entries
where the rules find no deciding line (where the fallback applies).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from slurm_robust.launcher import classify_model as cm
from slurm_robust.launcher.classify import LEARNED_FROM, classify, model_features
from slurm_robust.launcher.classify import Evidence as ClassifyEvidence
from slurm_robust_rehearsal.bench.corpus_split import Split, split_of

#: Training settings (chosen by cross-validation on the development split; see --cv).
L2 = 3e-5
STEPS = 1000
STEP_SIZE = 1.0
MOMENTUM = 0.9
#: A word must occur in this many training entries to be in the vocabulary (a word seen
#: once is a project's name or a path, not a failure's wording).
MIN_ENTRIES = 2
#: Weights are stored to this many decimals (smaller file, no false precision).
DECIMALS = 3
CV_FOLDS = 5
CV_SEEDS = (0, 1, 2)


def development(entries: Sequence[Any]) -> list[Any]:
    """The development entries, sorted by id (the order training sees them in)."""
    return sorted((e for e in entries if split_of(e.url) is Split.DEVELOPMENT),
                  key=lambda e: e.id)


def ids_hash(entries: Sequence[Any]) -> str:
    return hashlib.sha256("\n".join(sorted(e.id for e in entries)).encode()).hexdigest()


def entry_features(entry: Any) -> set[str]:
    """The entry's features exactly as inference computes them (classify.model_features:
    the normalised log tail, the exit status as the classifier reads it)."""
    return model_features(_evidence(entry))


def train(entries: Sequence[Any]) -> dict[str, Any]:
    """The model file's JSON object, trained on the development entries of ``entries``
    (any held-out entry passed in is dropped first)."""
    dev = development(entries)
    if not dev:
        raise ValueError("no development entries to train on")
    docs = [entry_features(e) for e in dev]
    df: Counter[str] = Counter()
    for d in docs:
        df.update(d)
    vocab = sorted(w for w, n in df.items() if n >= MIN_ENTRIES)
    index = {w: i for i, w in enumerate(vocab)}
    classes = sorted({e.cls for e in dev})
    x = np.zeros((len(dev), len(vocab)))
    for row, d in enumerate(docs):
        cols = [index[w] for w in d if w in index]
        x[row, cols] = 1.0
    x /= np.maximum(1.0, np.sqrt(x.sum(axis=1, keepdims=True)))
    y = np.zeros((len(dev), len(classes)))
    y[np.arange(len(dev)), [classes.index(e.cls) for e in dev]] = 1.0
    w = np.zeros((len(vocab), len(classes)))
    b = np.zeros(len(classes))
    vw, vb = np.zeros_like(w), np.zeros_like(b)
    for _ in range(STEPS):
        z = x @ w + b
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        g = (p - y) / len(dev)
        vw = MOMENTUM * vw + x.T @ g + L2 * w
        vb = MOMENTUM * vb + g.sum(axis=0)
        w -= STEP_SIZE * vw
        b -= STEP_SIZE * vb
    # One row of weights per word, in ``classes`` order.
    weights = {word: [round(float(v), DECIMALS) + 0.0 for v in w[i]]  # no "-0.0"
               for i, word in enumerate(vocab)}
    return {
        "model_version": cm.MODEL_VERSION,
        "tokenizer_version": cm.TOKENIZER_VERSION,
        "kind": "softmax regression over word presence",
        "trained_on": {"corpus": "tests/data/failure_corpus/corpus.jsonl",
                       "split": Split.DEVELOPMENT.value, "entries": len(dev),
                       "ids_sha256": ids_hash(dev)},
        "training": {"l2": L2, "steps": STEPS, "step_size": STEP_SIZE,
                     "momentum": MOMENTUM, "min_entries_per_word": MIN_ENTRIES,
                     "decimals": DECIMALS},
        "classes": classes,
        "bias": [round(float(v), DECIMALS) for v in b],
        "weights": weights,
    }


def dump(doc: dict[str, Any]) -> str:
    """The model file's text: compact, one word's weights per line (a retrain's diff
    shows which words moved)."""
    head = {k: v for k, v in doc.items() if k != "weights"}
    lines = [json.dumps(head, sort_keys=True)[:-1] + ', "weights": {']
    rows = [f"{json.dumps(word)}: {json.dumps(row, separators=(',', ':'))}"
            for word, row in sorted(doc["weights"].items())]
    return "\n".join(lines + [",\n".join(rows), "}}"]) + "\n"


def write_model(entries: Sequence[Any], path: Path = cm.MODEL_PATH) -> dict[str, Any]:
    doc = train(entries)
    path.write_text(dump(doc))
    return {"written": str(path), "bytes": path.stat().st_size,
            "words": len(doc["weights"]), "classes": len(doc["classes"]),
            "trained_on": doc["trained_on"]}


def _evidence(entry: Any) -> ClassifyEvidence:
    return ClassifyEvidence(exit_code=entry.exit_code, signal=entry.signal,
                            log_tail=entry.excerpt, change_recorded=entry.change_recorded)


def folds(entries: Sequence[Any], k: int, seed: int) -> list[list[Any]]:
    order = np.random.default_rng(seed).permutation(len(entries))
    return [[entries[i] for n, i in enumerate(order) if n % k == f] for f in range(k)]


def cross_validate(entries: Sequence[Any], seen: set[str], k: int = CV_FOLDS,
                   seeds: Sequence[int] = CV_SEEDS) -> dict[str, Any]:
    """k-fold cross-validation inside the development split (see the module docstring);
    counts are summed over the seeds and reported as means per seed."""
    dev = development(entries)
    rules = {e.id: classify(_evidence(e), learned=False) for e in dev}
    tally: Counter[str] = Counter()
    for seed in seeds:
        for held in folds(dev, k, seed):
            held_ids = {e.id for e in held}
            model = cm.model_from_json(train([e for e in dev if e.id not in held_ids]))
            for e in held:
                alone = model.predict(entry_features(e))
                c = classify(_evidence(e), model=model)
                r = rules[e.id]
                groups = ["all"] + (["not_seen"] if e.id not in seen else []) + \
                    ([LEARNED_FROM] if r.rule == LEARNED_FROM else [])
                for g in groups:
                    tally[f"{g}.n"] += 1
                    tally[f"{g}.rules"] += r.cls == e.cls
                    tally[f"{g}.with_fallback"] += c.cls == e.cls
                    tally[f"{g}.model_alone"] += alone is not None and alone.cls == e.cls
                    tally[f"{g}.changed"] += c.rule == "learned"
                    tally[f"{g}.wrong_side"] += {c.side, e.side} == {"infrastructure",
                                                                      "user"}
                    tally[f"{g}.evicts"] += c.evicts and c.rule == "learned"
    report: dict[str, Any] = {"folds": k, "seeds": list(seeds),
                              "development_entries": len(dev)}
    for g in ("all", "not_seen", LEARNED_FROM):
        n = tally[f"{g}.n"]
        report[g] = {"entries": n // len(seeds)} | {
            k2: round(tally[f"{g}.{k2}"] / n, 4) if n else None
            for k2 in ("rules", "with_fallback", "model_alone")} | {
            k2: round(tally[f"{g}.{k2}"] / len(seeds), 1)
            for k2 in ("changed", "wrong_side", "evicts")}
    return report
