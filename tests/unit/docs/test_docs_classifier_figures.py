"""The classifier's figures in the docs are the ones `slurm-robust bench classify` prints
today: every page that quotes them carries the bench's own headline sentence, and every
corpus size a page states is the corpus's size. A rule, a new entry or a retrain that
moves a figure fails here until the docs say so."""

from __future__ import annotations

import argparse
import re
from functools import lru_cache

import pytest

from slurm_robust_rehearsal.bench import classify as bench
from tests.unit.docs.docindex import REPO

#: The pages that quote the classifier's figures.
QUOTING = ("README.md", "docs/TAXONOMY.md", "docs/BENCHMARKS.md",
           "tests/data/failure_corpus/README.md")
#: How a page states the corpus's size ("761 real failures", "corpus (761 entries)").
SIZE = re.compile(r"\b(\d[\d,]*) real failures\b|\bcorpus \((\d[\d,]*) entries\)")


@lru_cache(maxsize=1)
def _result() -> dict:
    return bench.run(argparse.Namespace(corpus=bench.CORPUS, seen_ids=bench.SEEN_IDS,
                                        misses=False))


def _flat(rel: str) -> str:
    return " ".join((REPO / rel).read_text().split())


@pytest.mark.parametrize("rel", QUOTING)
def test_each_page_quotes_the_figures_the_bench_prints_now(rel: str) -> None:
    headline = _result()["headline"]
    assert headline in _flat(rel), (
        f"{rel} does not quote the classifier's current figures; run `slurm-robust bench "
        f"classify --json` and quote its headline: {headline!r}")


@pytest.mark.parametrize("rel", QUOTING)
def test_each_corpus_size_a_page_states_is_the_corpus_size(rel: str) -> None:
    sizes = {int((a or b).replace(",", "")) for a, b in SIZE.findall(_flat(rel))}
    assert sizes <= {_result()["entries"]}, (rel, sizes, _result()["entries"])


#: The pages that quote the comparison with people labelling the same entries.
QUOTING_REVIEWERS = ("docs/TAXONOMY.md", "tests/data/failure_corpus/README.md")


@pytest.mark.parametrize("rel", QUOTING_REVIEWERS)
def test_each_page_quotes_the_reviewer_comparison_the_bench_prints_now(rel: str) -> None:
    line = _result()["reviewers"]["line"]
    assert line and line in _flat(rel), (
        f"{rel} does not quote the reviewer comparison `bench classify --json` prints in "
        f"reviewers.line: {line!r}")


def test_the_headline_names_both_splits_and_every_decision_figure() -> None:
    headline = _result()["headline"]
    held, dev = _result()["held_out"], _result()["development"]
    assert headline.startswith(f"held-out: {100 * held['class_accuracy']:.1f} % of "
                               f"{held['entries']} right")
    assert f"development: {100 * dev['class_accuracy']:.1f} % of {dev['entries']}" in headline
    assert headline.count("healthy nodes evicted") == 2
