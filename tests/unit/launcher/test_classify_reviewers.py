"""The classifier beside people labelling the same entries (bench classify's
``reviewers``): the label files are checked row by row, and the figures are counts of
agreement per split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_robust.errors import UsageError
from slurm_robust_rehearsal.bench import classify as bench
from slurm_robust_rehearsal.bench import classify_reviewers as reviewers
from slurm_robust_rehearsal.bench.corpus_split import Split, split_of

ENTRIES, _ = bench.load_corpus(bench.CORPUS)
IDS = {e.id for e in ENTRIES}
DEV = [e for e in ENTRIES if split_of(e.url) is Split.DEVELOPMENT][:3]
HELD = [e for e in ENTRIES if split_of(e.url) is Split.HELD_OUT][:2]


def _write(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "labels.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("row", [
    {"v": 2, "id": DEV[0].id, "class": "nan", "side": "user", "decided": True},
    {"v": 1, "id": "no-such-entry", "class": "nan", "side": "user", "decided": True},
    {"v": 1, "id": DEV[0].id, "class": "gremlins", "side": "user", "decided": True},
    {"v": 1, "id": DEV[0].id, "class": "nan", "side": "theirs", "decided": True},
    {"v": 1, "id": DEV[0].id, "class": "nan", "side": "user", "decided": "yes"},
])
def test_a_row_that_is_not_a_label_of_a_corpus_entry_is_refused_with_its_line(tmp_path, row):
    good = {"v": 1, "id": DEV[1].id, "class": "nan", "side": "user", "decided": True}
    with pytest.raises(UsageError, match=r"labels\.jsonl:2: not a label row"):
        reviewers.load_labels(_write(tmp_path, [good, row]), IDS, "decided")


def test_an_entry_labelled_twice_is_refused(tmp_path):
    row = {"v": 1, "id": DEV[0].id, "class": "nan", "side": "user", "decided": True}
    with pytest.raises(UsageError, match=":2:"):
        reviewers.load_labels(_write(tmp_path, [row, row]), IDS, "decided")


def test_excerpt_only_figures_count_reviewer_and_classifier_per_split_and_group():
    answers = {e.id: bench.classify_entry(e) for e in DEV + HELD}
    labels = {
        # decided and right; decided and wrong; undecided and right (development)
        DEV[0].id: {"class": DEV[0].cls, "decided": True},
        DEV[1].id: {"class": "gpu_oom" if DEV[1].cls != "gpu_oom" else "nan", "decided": True},
        DEV[2].id: {"class": DEV[2].cls, "decided": False},
        # one undecided held-out entry, wrong
        HELD[0].id: {"class": "nan" if HELD[0].cls != "nan" else "gpu_oom", "decided": False},
    }
    rep = reviewers.excerpt_only(ENTRIES, answers, labels)
    dev, held = rep["development"], rep["held_out"]
    assert dev["all"]["entries"] == 3 and dev["all"]["reviewer"] == round(2 / 3, 4)
    assert dev["decided"] == {"entries": 2, "reviewer": 0.5, "classifier": pytest.approx(
        sum(answers[e.id].cls == e.cls for e in DEV[:2]) / 2, abs=1e-4)}
    assert held["all"]["entries"] == held["undecided"]["entries"] == 1
    assert held["decided"] == {"entries": 0, "reviewer": None, "classifier": None}
    assert rep["all"]["all"]["entries"] == 4


def test_thread_relabels_agree_on_class_and_on_sides_both_readers_named():
    e = DEV[0]
    other = "user" if e.side == "infrastructure" else "infrastructure"
    labels = {e.id: {"class": e.cls, "side": other, "found": True},
              HELD[0].id: {"class": HELD[0].cls, "side": "unknown", "found": False}}
    rep = reviewers.thread_relabel(ENTRIES, labels)["all"]
    assert rep["entries"] == 2 and rep["class_agreement"] == 1.0
    assert rep["threads_found"] == 1
    named = e.side in ("infrastructure", "user")
    assert rep["side_agreement"] == (0.0 if named else None)


def test_the_shipped_label_files_load_and_the_line_names_the_held_out_sample():
    rep = reviewers.report(ENTRIES, {e.id: bench.classify_entry(e) for e in ENTRIES})
    assert rep["excerpt_only"]["held_out"]["all"]["entries"] >= 30
    assert "held-out entries a reviewer labelling from the excerpt alone" in rep["line"]


def test_every_corpus_entry_has_an_excerpt_only_label():
    labelled = reviewers.load_labels(reviewers.EXCERPT_ONLY, IDS, "decided")
    missing = sorted(IDS - set(labelled))
    assert not missing, (f"{len(missing)} entries have no excerpt-only label (the corpus "
                         f"README: a new batch goes to the review after its commit): "
                         f"{missing[:5]}")
