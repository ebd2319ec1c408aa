"""The drain circuit breaker: at most ``max_drains`` distinct nodes per window, even when
many nodes' prologs ask at once; past it "would drain" records, not drains; a private
directory only; ``reset`` for the admin; and the node programs' failure path obeying it."""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.health.breaker import (
    BreakerConfig,
    BreakerUnavailable,
    DrainBreaker,
    breaker_config,
)

T0 = 1_800_000_000.0


def _breaker(tmp_path, max_drains=2, window_s=600.0) -> DrainBreaker:
    return DrainBreaker(BreakerConfig(max_drains, window_s, str(tmp_path / "breaker")))


def test_drains_past_the_limit_are_held_back_and_recorded(tmp_path):
    b = _breaker(tmp_path)
    assert b.claim("n1", "slurm_robust: gpu_xid: Xid 79", "prolog", T0).granted
    assert b.claim("n2", "slurm_robust: gpu_xid: Xid 79", "prolog", T0 + 1).granted
    held = b.claim("n3", "slurm_robust: gpu_xid: Xid 79", "epilog", T0 + 2)
    assert not held.granted and held.in_window == 2 and "tripped" in held.why
    # The same node again (a refreshed reason) is not a new drain.
    assert b.claim("n1", "slurm_robust: gpu_ecc", "epilog", T0 + 3).granted
    st = b.status(T0 + 4)
    assert st["tripped"] and st["in_window"] == 2
    assert [w["node"] for w in st["would_drain"]] == ["n3"]
    assert st["would_drain"][0]["source"] == "epilog"
    assert st["would_drain"][0]["reason"] == "slurm_robust: gpu_xid: Xid 79"


def test_the_window_slides(tmp_path):
    b = _breaker(tmp_path, window_s=600.0)
    assert b.claim("n1", "r", "prolog", T0).granted
    assert b.claim("n2", "r", "prolog", T0 + 300).granted
    assert not b.claim("n3", "r", "prolog", T0 + 400).granted
    assert b.claim("n3", "r", "prolog", T0 + 601).granted  # n1's drain left the window
    assert not b.status(T0 + 601)["tripped"] or b.status(T0 + 601)["in_window"] == 2


def test_reset_forgets_the_window(tmp_path):
    b = _breaker(tmp_path, max_drains=1)
    assert b.claim("n1", "r", "prolog", T0).granted
    assert not b.claim("n2", "r", "prolog", T0 + 1).granted
    assert b.reset("admin", T0 + 2) == 1
    assert b.claim("n2", "r", "prolog", T0 + 3).granted
    assert any(w.get("reset_by") == "admin" for w in b.status(T0 + 4)["would_drain"])


def test_off_grants_everything_and_writes_nothing(tmp_path):
    b = DrainBreaker(BreakerConfig(None, 600.0, str(tmp_path / "breaker")))
    assert all(b.claim(f"n{i}", "r", "prolog").granted for i in range(50))
    assert not (tmp_path / "breaker").exists()


def _claim_one(args):
    path, node = args
    b = DrainBreaker(BreakerConfig(3, 3600.0, path))
    return b.claim(node, "slurm_robust: same bug everywhere", "prolog").granted


def test_many_nodes_at_once_get_exactly_the_limit(tmp_path):
    """The case the breaker exists for: one buggy check fails on every node at once."""
    path = str(tmp_path / "breaker")
    with multiprocessing.get_context("fork").Pool(8) as pool:
        granted = pool.map(_claim_one, [(path, f"node{i}") for i in range(40)])
    assert sum(granted) == 3
    st = DrainBreaker(BreakerConfig(3, 3600.0, path)).status(last=100)
    assert st["in_window"] == 3 and len(st["would_drain"]) == 37


def test_a_directory_others_can_write_is_refused(tmp_path):
    d = tmp_path / "breaker"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o777)
    with pytest.raises(BreakerUnavailable, match="mode 0700"):
        _breaker(tmp_path).claim("n1", "r", "prolog", T0)
    os.chmod(d, 0o700)
    os.symlink(d, tmp_path / "link")
    b = DrainBreaker(BreakerConfig(2, 600.0, str(tmp_path / "link")))
    with pytest.raises(BreakerUnavailable):
        b.claim("n1", "r", "prolog", T0)


def test_a_torn_line_is_skipped(tmp_path):
    b = _breaker(tmp_path)
    assert b.claim("n1", "r", "prolog", T0).granted
    with open(tmp_path / "breaker" / "claims.jsonl", "a") as f:
        f.write('{"node": "n9", "ti')
    assert b.claim("n2", "r", "prolog", T0 + 1).granted
    assert b.status(T0 + 2)["in_window"] == 2


@pytest.mark.parametrize("raw, match", [
    ({"max_drains": 0}, "max_drains"), ({"max_drains": True}, "max_drains"),
    ({"max_drains": 2, "window_s": -1}, "window_s"), ({"dir": "rel/path"}, "absolute"),
    ({"max_drain": 2}, "unknown key"), ([], "object")])
def test_bad_config_names_the_key(raw, match):
    with pytest.raises(UsageError, match=match):
        breaker_config(raw)


def test_the_node_program_keeps_the_node_when_tripped(tmp_path, monkeypatch):
    """The prolog's failure path once the breaker is tripped: no Slurm call, exit 0 (a
    non-zero prolog would make Slurm drain the node itself), a "would drain" record.
    The granted path, a real drain, is the integration test's."""
    import io

    from slurm_robust import node_program

    site = tmp_path / "site.json"
    site.write_text(json.dumps({"state_dir": str(tmp_path / "{node}"),
                                "breaker": {"max_drains": 1, "window_s": 600,
                                            "dir": str(tmp_path / "breaker")}}))
    monkeypatch.setenv("SLURM_ROBUST_CONFIG", str(site))
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-slurm.conf"))  # any call would fail
    b = DrainBreaker(BreakerConfig(1, 600.0, str(tmp_path / "breaker")))
    assert b.claim("node1", "slurm_robust: gpu_xid: x", "prolog").granted
    err = io.StringIO()
    code = node_program._drain_and_fail("prolog", "node2", "slurm_robust: gpu_xid: x", err,
                                        repeatable=False)
    assert code == node_program.EXIT_OK, err.getvalue()
    assert "not drained: breaker tripped" in err.getvalue()
    assert [w["node"] for w in b.status()["would_drain"]] == ["node2"]


def test_the_reserve_asks_before_each_drain(tmp_path):
    """EpilogSlurmctld's verdicts and reconcile's failed deep checks drain through the
    reserve executor: past the limit its outcome is "skipped" with the breaker's words
    and no drain reaches Slurm (the Slurm side is a recorder here; the node programs'
    path is the integration test's, on the real cluster)."""
    from slurm_robust.reserve.executor import Executor
    from slurm_robust.reserve.plan import Drain
    from slurm_robust.slurm import Node

    class Recorder:
        def __init__(self):
            self.drained = []

        def nodes(self, names):
            return [Node(n, "idle", frozenset(), "", "", 0, ("train",), 2, 0) for n in names]

        def drain(self, name, reason):
            self.drained.append(name)

    slurm = Recorder()
    ex = Executor(slurm, None, tmp_path / "reserve.jsonl", "handoff",  # type: ignore[arg-type]
                  breaker=_breaker(tmp_path, max_drains=1))
    out = ex.apply([Drain(n, "slurm_robust: pending deep check: node_lost", "verdict")
                    for n in ("n1", "n2")])
    assert slurm.drained == ["n1"]
    assert "skipped" not in out[0] and "breaker tripped" in out[1]["skipped"]
