"""Restore agreement and backup placement: pure functions, no torch.distributed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_robust import ckpt
from slurm_robust.ckpt import CopyInfo, ParallelLayout, choose_restore_step, pick_peers


def copy(rank: int, step: int, tier: str = "memory", holder: int | None = None,
         valid: bool = True) -> CopyInfo:
    holder = rank if holder is None else holder
    return CopyInfo(rank, step, tier, holder, f"/x/{tier}/{rank}/{step}/{holder}", valid)


def test_newest_step_that_every_rank_has():
    copies = [copy(0, 7), copy(0, 8), copy(1, 7), copy(1, 6), copy(2, 8), copy(2, 7)]
    plan = choose_restore_step(copies, 3)
    assert plan.step == 7
    assert plan.tiers() == {0: "memory", 1: "memory", 2: "memory"}


def test_tiers_are_walked_in_order_and_own_copies_win():
    copies = [copy(0, 5, "durable"), copy(0, 5, "local"), copy(0, 5, "peer", holder=1),
              copy(1, 5, "durable"), copy(1, 5, "peer", holder=0)]
    plan = choose_restore_step(copies, 2)
    assert plan.tiers() == {0: "peer", 1: "peer"}
    assert plan.sources[0].holder == 1
    copies.append(copy(1, 5, "memory"))
    assert choose_restore_step(copies, 2).tiers() == {0: "peer", 1: "memory"}


def test_excluded_copy_falls_back_to_the_next_tier_then_an_older_step():
    bad = copy(0, 9, "memory")
    copies = [bad, copy(0, 9, "local"), copy(0, 6, "durable"), copy(1, 9), copy(1, 6, "durable")]
    assert choose_restore_step(copies, 2, exclude=[bad]).sources[0].tier == "local"
    plan = choose_restore_step(copies, 2, exclude=[bad, copies[1]])
    assert (plan.step, plan.tiers()) == (6, {0: "durable", 1: "durable"})


def test_nothing_anywhere_is_a_fresh_start_but_damage_is_an_error():
    assert choose_restore_step([], 4) is None
    with pytest.raises(ckpt.NoValidCheckpointError, match="missing ranks"):
        choose_restore_step([copy(0, 3), copy(1, 4)], 2)
    with pytest.raises(ckpt.NoValidCheckpointError):
        choose_restore_step([copy(0, -1, valid=False)], 1)


def test_volatile_copies_lost_with_nodes_before_the_first_durable_save_start_fresh():
    # A requeue that lost rank 0's node and its peer's: rank 1 still has its memory copy
    # of step 12, and the first durable save (every 20 steps) was not due yet.
    some = [copy(1, 12), copy(1, 11, "peer", holder=2)]
    assert choose_restore_step(some, 2, durable_every=20) is None
    assert choose_restore_step(some, 2, durable_every=0) is None  # durable tier off
    with pytest.raises(ckpt.NoValidCheckpointError):  # the caller did not say: as before
        choose_restore_step(some, 2)
    with pytest.raises(ckpt.NoValidCheckpointError):  # a durable save was due: missing
        choose_restore_step([copy(1, 25)], 2, durable_every=20)
    with pytest.raises(ckpt.NoValidCheckpointError):  # a durable copy of some ranks only
        choose_restore_step([copy(1, 12), copy(1, 10, "durable")], 2, durable_every=10)
    with pytest.raises(ckpt.NoValidCheckpointError):  # damage is never a fresh start
        choose_restore_step([copy(1, 12), copy(0, 12, valid=False)], 2, durable_every=20)
    with pytest.raises(ckpt.NoValidCheckpointError):
        choose_restore_step(some, 2, exclude=[some[1]], durable_every=20)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6),
                          st.sampled_from(ckpt.TIERS)), max_size=30))
def test_choice_is_newest_common_step(entries):
    copies = [copy(r, s, t) for r, s, t in entries]
    steps = [{s for r2, s, _ in entries if r2 == r} for r in range(4)]
    common = set.intersection(*steps)
    if not copies:
        assert choose_restore_step(copies, 4) is None
    elif not common:
        with pytest.raises(ckpt.NoValidCheckpointError):
            choose_restore_step(copies, 4)
    else:
        plan = choose_restore_step(copies, 4)
        assert plan.step == max(common)
        for rank, chosen in plan.sources.items():
            best = min(ckpt.TIERS.index(t) for r, s, t in entries
                       if r == rank and s == plan.step)
            assert ckpt.TIERS.index(chosen.tier) == best


def test_byterobust_layout_backups_share_no_group_and_leave_the_node():
    layout = ParallelLayout(tp=2, pp=4, dp=2)
    nodes = ["n0"] * 8 + ["n1"] * 8
    peers = pick_peers(layout, nodes)
    assert sorted(peers) == list(range(16))
    for rank, peer in enumerate(peers):
        assert nodes[peer] != nodes[rank]
        assert layout.shared_groups(rank, peer) == []


def test_pure_data_parallel_backs_up_to_the_next_node():
    nodes = ["a", "a", "b", "b", "c", "c"]
    assert pick_peers(ParallelLayout.data_parallel(6), nodes) == [2, 3, 4, 5, 0, 1]
    assert ckpt.backup_sources([2, 3, 4, 5, 0, 1]) == [4, 5, 0, 1, 2, 3]


def test_one_node_cannot_hold_a_peer_backup():
    with pytest.raises(ckpt.PeerBackupError, match="two nodes"):
        pick_peers(ParallelLayout.data_parallel(4), ["a"] * 4)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.integers(2, 4),
       st.sampled_from(["tp-dp-pp", "tp-pp-dp"]))
def test_evicting_any_group_never_loses_both_copies(tp, pp, dp, n_nodes, order):
    layout = ParallelLayout(tp=tp, pp=pp, dp=dp, order=order)
    world = layout.world_size
    if world % n_nodes:
        return
    per_node = world // n_nodes
    nodes = [f"n{r // per_node}" for r in range(world)]
    peers = pick_peers(layout, nodes)
    assert sorted(peers) == list(range(world))
    multi_dims = sum(size > 1 for size in (tp, pp, dp))
    for rank, peer in enumerate(peers):
        assert nodes[peer] != nodes[rank]
        if multi_dims >= 2:
            # Any one TP, PP or DP group evicted: rank and its backup are never both in it.
            assert layout.shared_groups(rank, peer) == []
