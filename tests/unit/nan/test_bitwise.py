"""The bitwise reference test: the fixed step's digest, the comparison, and the recovery
owner evicting the node whose digest differs (scripted reports, fake clock)."""

from __future__ import annotations

import json

from slurm_robust.launcher.control.bitwise import compare
from slurm_robust.launcher.enums import Role
from slurm_robust.launcher.node.nan_local import BITWISE_FILE, Rehearsal, nan_dir
from slurm_robust.launcher.node.reference_step import reference_digest
from tests.unit.launcher.control.test_recovery_owner import Harness
from tests.unit.nan.test_nan_recovery import _nan


def test_reference_digest_is_fixed_and_a_flipped_bit_changes_it():
    assert reference_digest() == reference_digest()
    assert reference_digest(corrupt=True) != reference_digest()


def test_compare_names_the_node_off_the_majority():
    nodes = ["a", "a", "b", "b", "c", "c"]
    res = compare({0: "x", 1: "x", 2: "x", 3: "y", 4: "x", 5: "x"}, nodes)
    assert res.differing == ("b",) and not res.passed and res.reference == "x"
    assert compare({0: "x", 1: "x", 2: "x", 3: "x"}, nodes).passed


def test_a_tie_names_nobody():
    assert compare({0: "x", 1: "y"}, ["a", "b"]).differing == ()


def test_sdc_never_hits_the_same_step_in_consecutive_attempts():
    r = Rehearsal(sdc_probability=0.5, sdc_seed=3)
    for step in range(1, 200):
        assert not (r.corrupts(step, 4) and r.corrupts(step, 5))


def _bitwise(h: Harness, digests: dict[int, str], req: str) -> None:
    for m in h.slot_members():
        for r in h.rec.ranks_of(m.index):
            h.report(m, [{"kind": "bitwise", "rank": r, "id": req, "digest": digests[r]}])


def test_a_moving_nan_asks_for_the_bitwise_test_and_evicts_the_differing_node(tmp_path):
    h = Harness(tmp_path, nodes=3, spares=1)
    h.start()
    n1, n2, n3 = h.slot_members()
    for m, local in ((n1, False), (n2, True), (n3, False)):
        _nan(h, m, 4, local, 3)
    h.tick(0.4)
    h.restored(3)
    for m, local in ((n1, False), (n2, True), (n3, False)):
        _nan(h, m, 6, local, 5)  # it moved: suspected SDC
    h.tick(0.4)
    request = json.loads((nan_dir(h.cfg.run_dir) / BITWISE_FILE).read_text())
    assert request["attempt"] == h.rec.gen.attempt
    _bitwise(h, {0: "good", 1: "bad", 2: "good"}, request["id"])
    h.tick(0.05)
    h.wait_slurm()
    assert h.rec.gen.slots == [0, 3, 2]  # n2's slot went to the spare
    assert h.rec.plan_for(1).role is Role.EVICTED
    assert ("verdict", "n2", "nan") in h.slurm.calls
    inc = h.rec.state.open_incident.to_json()
    assert inc["rung"] == "spare" and inc["evidence"]["nan"]["resolution"] == "evict"
    assert inc["evidence"]["nan"]["bitwise"]["differing_nodes"] == ["n2"]


def test_identical_digests_evict_nobody(tmp_path):
    h = Harness(tmp_path, nodes=3, spares=1)
    h.start()
    for step in (4, 6):
        for m, local in zip(h.slot_members(), (False, True, False), strict=True):
            _nan(h, m, step, local, step - 1)
        h.tick(0.4)
        h.restored(3)
    request = json.loads((nan_dir(h.cfg.run_dir) / BITWISE_FILE).read_text())
    gen = h.gen()
    _bitwise(h, {0: "same", 1: "same", 2: "same"}, request["id"])
    h.tick(0.05)
    assert h.gen() == gen and h.rec.bitwise_req is None
    assert h.rec.state.open_incident.evidence["nan"]["bitwise"]["result"] == "all identical"


def test_the_first_nan_already_asks_for_the_bitwise_test(tmp_path):
    h = Harness(tmp_path, nodes=3, spares=1)
    h.start()
    for m, local in zip(h.slot_members(), (False, True, False), strict=True):
        _nan(h, m, 4, local, 3)
    h.tick(0.4)
    request = json.loads((nan_dir(h.cfg.run_dir) / BITWISE_FILE).read_text())
    assert request["attempt"] == h.rec.gen.attempt
    assert h.rec.state.open_incident.to_json()["evidence"]["nan"]["bitwise"] == {
        "requested": request["id"]}
