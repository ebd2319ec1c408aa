"""The classifier on the real-log corpus (tests/data/failure_corpus), entry by entry and
as a whole, with the figures `slurm-robust bench classify` reports."""

from __future__ import annotations

import argparse

import pytest

from slurm_robust.rehearsal.bench import classify as bench
from slurm_robust.taxonomy import Action, Side

ENTRIES, UNREADABLE = bench.load_corpus(bench.CORPUS)


def test_corpus_is_large_and_fully_readable():
    assert len(ENTRIES) >= 150
    assert UNREADABLE == []
    assert len({e.id for e in ENTRIES}) == len(ENTRIES)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_no_entry_is_evicted_without_infrastructure_evidence(entry):
    c = bench.classify_entry(entry)
    if entry.side == Side.USER.value:
        assert not c.evicts, (entry.id, c.cls, c.line)
    if c.evicts:
        assert c.side == Side.INFRASTRUCTURE.value
    assert c.action in {a.value for a in Action}


def _bench() -> dict:
    return bench.run(argparse.Namespace(corpus=bench.CORPUS, seen_ids=bench.SEEN_IDS,
                                        misses=False))


def test_side_decisions_meet_their_targets():
    r = _bench()
    assert r["healthy_nodes_evicted"] == 0
    assert r["wrong_side_share"] <= bench.TARGET_WRONG_SIDE
    total = sum(sum(row.values()) for k, row in r["side_confusion"].items()
                if k in bench.SIDES)
    assert total == r["entries"] == len(ENTRIES)


def test_the_change_record_decides_the_code_data_changes():
    """Entries whose thread states a change get the launcher's change record:
    with it every code/data change is named, without it none; nothing else moves but
    for the better, and no side decision gets worse."""
    r, bare = _bench(), bench.score(ENTRIES, with_change=False)
    assert r["by_class"]["code_data_change"]["accuracy"] == 1.0
    assert bare["by_class"]["code_data_change"]["correct"] == 0
    assert r["class_accuracy"] > bare["class_accuracy"]
    assert r["without_change_records"]["class_accuracy"] == bare["class_accuracy"]
    assert r["wrong_side"] <= bare["wrong_side"]


def test_class_accuracy_meets_the_target():
    assert _bench()["class_accuracy"] >= bench.TARGET_CLASS_ACCURACY
