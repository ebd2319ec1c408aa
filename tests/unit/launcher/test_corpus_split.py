"""The failure corpus's held-out split: fixed by the thread URL's hash, about 30 %."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_robust_rehearsal.bench import classify as bench
from slurm_robust_rehearsal.bench.corpus_split import HELD_OUT_BELOW, Split, split_of


def test_the_split_is_the_first_byte_of_the_url_hash():
    # sha256 first bytes: 0x42 (< 0x4d) and 0x8f; pinned so that the rule cannot drift.
    assert split_of("https://github.com/NVIDIA/nccl/issues/1814") is Split.HELD_OUT
    assert split_of("https://github.com/pytorch/pytorch/issues/1") is Split.DEVELOPMENT
    assert HELD_OUT_BELOW == 0x4D


def test_the_split_is_deterministic_and_about_30_percent_of_the_corpus():
    urls = [json.loads(line)["url"] for line in bench.CORPUS.read_text().splitlines()
            if line.strip()]
    first = [split_of(u) for u in urls]
    assert first == [split_of(u) for u in urls]
    share = first.count(Split.HELD_OUT) / len(first)
    assert 0.22 <= share <= 0.38, share


def test_an_entry_without_a_url_has_no_split(tmp_path: Path):
    with pytest.raises(ValueError, match="URL"):
        split_of("")
    line = {"v": 1, "id": "x", "url": "", "project": "p", "excerpt": "boom",
            "class": "user_exception", "side": "user", "exit_code": 1, "signal": None,
            "exit_basis": "python exception", "notes": ""}
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps(line) + "\n")
    entries, bad = bench.load_corpus(corpus)
    assert entries == [] and len(bad) == 1 and "URL" in bad[0]
