"""``slurm-robust reserve reconcile|status`` on the real mini-cluster.

To leave the shared ``train``/``standby`` layout alone, these tests run the reserve over two
runtime partitions of their own (``rtest_train`` = spare[1-2], ``rtest_standby`` empty,
deleted afterwards) with their own reserve log. spare[1-2]'s health journals are set aside
for each test (and merged back after), so no node starts with a deep pass and reconcile
must have the deep suite run -- on the node, by its own slurmd, which journals where the
cluster's site config says. A reservation keeps other tests' jobs off spare[1-2] meanwhile.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_robust.cli.main import main
from slurm_robust.health.journal import journal_path
from slurm_robust.site_config import load_site_config

pytestmark = pytest.mark.integration

TRAIN, STANDBY, RESV = "rtest_train", "rtest_standby", "rtest_reconcile"
NODES = ["spare1", "spare2"]


@pytest.fixture()
def reserve_site(minicluster, tmp_path, monkeypatch):
    s = minicluster.slurm
    for key, value in minicluster.cfg.env().items():
        monkeypatch.setenv(key, value)
    site = json.loads(minicluster.cfg.robust_conf.read_text())
    site.update(verdict_log=str(tmp_path / "log" / "verdicts.jsonl"),
                reserve={"partition": STANDBY, "train_partitions": [TRAIN], "target": 1})
    path = tmp_path / "site.json"
    path.write_text(json.dumps(site))
    journals = [journal_path(n, load_site_config(path)) for n in NODES]
    for j in journals:
        if j.exists():
            j.rename(j.with_name(j.name + ".saved"))
    s.create_reservation(RESV, NODES, ["root"], 20)
    s.create_partition(TRAIN, NODES)
    s.create_partition(STANDBY, [])
    yield s, path, tmp_path
    for j in journals:
        saved = j.with_name(j.name + ".saved")
        if saved.exists():
            saved.write_bytes(saved.read_bytes() + (j.read_bytes() if j.exists() else b""))
            saved.rename(j)
    for part in (TRAIN, STANDBY):
        s.delete_partition(part)
    s.delete_reservation(RESV)
    for node in NODES:
        n = s.node(node)
        if n.drained and n.reason.startswith("slurm_robust:"):
            s.resume(node)


def reconcile_json(path: Path, capsys, *extra: str) -> dict:
    rc = main(["reserve", "reconcile", "--config", str(path), "--json", *extra])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    return out


def test_reconcile_deep_checks_fills_to_target_and_is_idempotent(reserve_site, capsys):
    s, path, tmp = reserve_site
    first = reconcile_json(path, capsys)
    kinds = [(o["action"], o["node"]) for o in first["outcomes"]]
    assert kinds == [("deep_check", "spare1"), ("move", "spare1")]
    assert first["outcomes"][0]["passed"] is True
    assert s.partition_nodes(STANDBY) == ["spare1"]
    assert s.partition_nodes(TRAIN) == ["spare2"]
    assert first["spares_after"] == ["spare1"]
    second = reconcile_json(path, capsys)
    assert second["outcomes"] == [] and second["spares_before"] == ["spare1"]
    logged = [json.loads(line) for line in (tmp / "log" / "reserve.jsonl").read_text()
              .splitlines()]
    assert [r["action"] for r in logged] == ["deep_check", "move"]

    main(["reserve", "status", "--config", str(path), "--json"])
    status = json.loads(capsys.readouterr().out)
    assert status["target"] == 1 and status["spares"] == 1 and status["deficit"] == 0
    assert [m["node"] for m in status["members"] if m["spare"]] == ["spare1"]


def test_drained_member_leaves_and_surplus_returns(reserve_site, capsys):
    s, path, _ = reserve_site
    reconcile_json(path, capsys)
    s.drain("spare1", "slurm_robust: test: actual bad, expected good")
    out = reconcile_json(path, capsys)
    moves = [(o["node"], o["src"], o["dst"]) for o in out["outcomes"] if o["action"] == "move"]
    assert ("spare1", [STANDBY], TRAIN) in moves and ("spare2", [TRAIN], STANDBY) in moves
    assert s.partition_nodes(STANDBY) == ["spare2"]
    s.resume("spare1")
    surplus = reconcile_json(path, capsys, "--target", "0")
    assert [(o["node"], o["dst"]) for o in surplus["outcomes"]] == [("spare2", TRAIN)]
    assert s.partition_nodes(STANDBY) == [] and s.partition_nodes(TRAIN) == NODES


def test_two_reconciles_at_once_fill_once(reserve_site, minicluster):
    s, path, _ = reserve_site
    argv = [sys.executable, "-m", "slurm_robust.cli.main", "reserve", "reconcile",
            "--config", str(path), "--json"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=minicluster.env)
             for _ in range(2)]
    outs = [json.loads(p.communicate(timeout=180)[0]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    moves = [o for out in outs for o in out["outcomes"] if o["action"] == "move"]
    print(json.dumps({"lock_wait_s": [out["lock_wait_s"] for out in outs]}))
    # The lock is held only to plan and move: the second run either found the first's
    # candidate pending its check (drained) and left it, or checked another and found
    # the reserve full when it re-planned under the lock. Never two fills.
    assert len(moves) == 1
    final = s.partition_nodes(STANDBY)
    assert len(final) == 1
    assert all(set(out["spares_after"]) <= set(final) for out in outs), outs
