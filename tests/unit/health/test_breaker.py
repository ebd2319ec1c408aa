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


# --- per-partition and share limits, the webhook ----------------------------------------

GPU = {f"g{i}" for i in range(10)}
CPU = {f"c{i}" for i in range(90)}
TOPOLOGY = {"gpu": GPU, "cpu": CPU, "all": GPU | CPU}


def _limits(tmp_path, topology=lambda: TOPOLOGY, **raw) -> DrainBreaker:
    return DrainBreaker(breaker_config({"dir": str(tmp_path / "breaker"), **raw}), topology)


def test_a_partition_at_its_limit_holds_its_own_nodes_back_only(tmp_path):
    b = _limits(tmp_path, max_drains=50, partitions={"gpu": {"max_drains": 2}})
    assert b.claim("g1", "r", "prolog", T0).granted
    assert b.claim("g2", "r", "prolog", T0 + 1).granted
    held = b.claim("g3", "r", "prolog", T0 + 2)
    assert not held.granted and "partition gpu" in held.why and held.max_drains == 2
    assert b.claim("c1", "r", "prolog", T0 + 3).granted  # the CPU nodes still drain
    st = b.status(T0 + 4)
    assert st["tripped"] and st["would_drain"][-1]["limit"] == "partition gpu"
    assert st["drains"][0]["partitions"] == ["all", "gpu"]


def test_share_limits_follow_the_partition_sizes(tmp_path):
    # 20 % of the 10 GPU nodes is 2; 2 % of all 100 nodes is 2; a share never allows 0.
    b = _limits(tmp_path, max_share=0.02, partitions={"gpu": {"max_share": 0.2}})
    assert b.claim("g1", "r", "prolog", T0).granted
    assert b.claim("c1", "r", "prolog", T0 + 1).granted
    held = b.claim("c2", "r", "prolog", T0 + 2)
    assert not held.granted and "the cluster" in held.why and held.max_drains == 2
    tiny = _limits(tmp_path / "t", max_share=0.001)
    assert tiny.claim("c1", "r", "prolog", T0).granted
    assert not tiny.claim("c2", "r", "prolog", T0 + 1).granted


def test_an_unreadable_topology_keeps_the_absolute_limit_and_says_so(tmp_path):
    def broken():
        raise OSError("scontrol: timed out")

    b = _limits(tmp_path, topology=broken, max_drains=1, max_share=0.5)
    first = b.claim("c1", "r", "prolog", T0)
    assert first.granted and "partitions not read" in first.why
    assert not b.claim("c2", "r", "prolog", T0 + 1).granted


def test_the_webhook_is_posted_once_per_trip(tmp_path):
    import http.server
    import threading

    got = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the http.server API
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/hook"
        b = _limits(tmp_path, max_drains=1, webhook=url)
        assert b.claim("c1", "r", "prolog", T0).granted
        for i, node in enumerate(["c2", "c3", "c4"]):  # one trip: one post
            assert not b.claim(node, "slurm_robust: gpu_xid", "epilog", T0 + 1 + i).granted
        assert b.reset("admin", T0 + 10) == 1
        assert b.claim("c5", "r", "prolog", T0 + 11).granted
        assert not b.claim("c6", "r", "prolog", T0 + 12).granted  # a second trip
    finally:
        server.shutdown()
    assert [(g["event"], g["node"], g["limit"], g["max"]) for g in got] == [
        ("drain_breaker_tripped", "c2", "the cluster", 1),
        ("drain_breaker_tripped", "c6", "the cluster", 1)]
    # A hook that cannot be reached is logged; the decision stands.
    dead = _limits(tmp_path / "d", max_drains=1, webhook="http://127.0.0.1:9/none")
    assert dead.claim("c1", "r", "prolog", T0).granted
    assert not dead.claim("c2", "r", "prolog", T0 + 1).granted


def test_limit_keys_are_validated():
    for raw, words in (({"max_share": 0}, "max_share"), ({"max_share": 1.5}, "max_share"),
                       ({"partitions": {"gpu": {"max_drains": 0}}}, "partitions.gpu"),
                       ({"partitions": {"gpu": {"max": 2}}}, "partitions.gpu"),
                       ({"partitions": []}, "partitions"),
                       ({"webhook": "ftp://x"}, "webhook"), ({"webhook": 3}, "webhook")):
        with pytest.raises(UsageError, match=words):
            breaker_config(raw)
    assert breaker_config({"partitions": {"gpu": {"max_share": 0.1}}}).enabled
    assert not breaker_config({"window_s": 60}).enabled
