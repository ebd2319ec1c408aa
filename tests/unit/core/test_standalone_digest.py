"""The fault-free reference (the rehearsal's bench/reference.py, which the integration tests
use through cluster_helpers.standalone_digest, cached per session, and bench many-nodes
directly): what it accepts from the ranks it starts, with small scripts in place of the
examples."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slurm_robust_rehearsal.bench.reference import TEARDOWN_ABORT, ReferenceFailed
from tests.integration.cluster_helpers import standalone_digest

SCRIPT = f"""
import os, sys
rank = int(os.environ["RANK"])
if rank == 0 and os.environ.get("DIGEST", "1") == "1":
    print("params_sha256=abc123 steps=4", flush=True)
if rank == 1 and os.environ.get("PEER") == "abort":
    sys.stderr.write({TEARDOWN_ABORT!r} + "\\n")
    sys.stderr.flush()
    os.abort()
if rank == 1 and os.environ.get("PEER") == "error":
    raise SystemExit("RuntimeError: the peer failed in its step")
"""


def run(tmp_path: Path, **env: str) -> str:
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    return standalone_digest([sys.executable, str(script)], 3, timeout_s=60,
                             env_extra=lambda rank: env)


def test_every_rank_clean_gives_rank_0s_digest(tmp_path: Path) -> None:
    assert run(tmp_path) == "abc123"


def test_a_peer_aborting_in_teardown_after_the_digest_is_accepted(tmp_path: Path) -> None:
    assert run(tmp_path, PEER="abort") == "abc123"


def test_a_peer_failing_otherwise_fails_the_reference(tmp_path: Path) -> None:
    with pytest.raises(ReferenceFailed, match="the peer failed"):
        run(tmp_path, PEER="error")


def test_the_teardown_abort_without_a_digest_fails(tmp_path: Path) -> None:
    with pytest.raises(ReferenceFailed):
        run(tmp_path, PEER="abort", DIGEST="0")


COUNTING = """
import os
if os.environ["RANK"] == "0":
    with open(os.environ["COUNT_FILE"], "a") as fh:
        fh.write("run\\n")
    print("params_sha256=feed42 steps=1", flush=True)
"""


def test_the_same_reference_is_computed_once_per_session(tmp_path: Path) -> None:
    count = tmp_path / "runs.txt"
    digests = []
    for copy in ("a", "b"):  # two copies of one script (as tests write into tmp_path)
        d = tmp_path / copy
        d.mkdir()
        (d / "ranks.py").write_text(COUNTING)
        digests.append(standalone_digest([sys.executable, str(d / "ranks.py")], 2,
                                         timeout_s=60,
                                         env_extra=lambda rank: {"COUNT_FILE": str(count)}))
    assert digests == ["feed42", "feed42"]
    assert count.read_text().splitlines() == ["run"]


def test_a_failed_reference_is_not_kept(tmp_path: Path) -> None:
    count = tmp_path / "runs.txt"
    script = tmp_path / "fails.py"
    script.write_text(COUNTING.replace('print("params_sha256=feed42 steps=1", flush=True)',
                                       'raise SystemExit(3)'))
    for _ in range(2):
        with pytest.raises(ReferenceFailed):
            standalone_digest([sys.executable, str(script)], 2, timeout_s=60,
                              env_extra=lambda rank: {"COUNT_FILE": str(count)})
    assert count.read_text().splitlines() == ["run", "run"]
