"""The analyzer on synthetic captures: which ranks are outliers, which group is named."""

from __future__ import annotations

import json

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.layout import ParallelLayout, parse_layout
from slurm_robust.stacks.analyze import AnalyzeOptions, analyze, compress_ranks, explain
from slurm_robust.stacks.dumps import Frame
from slurm_robust.stacks.signature import SignatureOptions
from slurm_robust_rehearsal.synth.stacks import synthetic_capture, synthetic_rank

FIG7 = parse_layout("tp=2,pp=4,dp=4", ranks_per_node=2)


def test_byterobust_fig7_pipeline_is_evicted():
    # Machine 15 stuck in all_gather; its pipeline (machines 3, 7, 11 in Megatron order)
    # waits in isend / irecv; the other 12 machines wait in the all-reduce.
    faults = {30: "all_gather", 31: "all_gather", 22: "isend", 23: "isend",
              14: "irecv", 15: "irecv", 6: "irecv", 7: "irecv"}
    result = analyze(synthetic_capture(FIG7, faults), FIG7)
    assert result.verdict == "evict"
    assert result.outlier_ranks == sorted(faults)
    assert result.eviction.dim == "pp"
    assert result.nodes == ["node3", "node7", "node11", "node15"]
    healthy = [g for g in result.groups if g.healthy]
    assert [g.size for g in healthy] == [24]
    assert sorted(g.size for g in result.groups if not g.healthy) == [2, 2, 4]


def test_one_blocked_rank_names_its_pipeline_and_with_dp_only_its_node():
    lay = parse_layout("tp=1,pp=2,dp=4", ranks_per_node=2)
    result = analyze(synthetic_capture(lay, {3: "blocked"}), lay)
    assert result.outlier_ranks == [3]
    assert result.eviction.groups == ((3, 7),)
    assert result.nodes == ["node1", "node3"]
    dp = parse_layout("dp=8", ranks_per_node=2)
    result = analyze(synthetic_capture(dp, {3: "blocked"}), dp)
    assert result.nodes == ["node1"]


def test_healthy_ranks_in_different_library_frames_are_not_outliers():
    # Ranks 1 and 2 are still in the Python wrapper of the all-reduce; rank 5 is blocked.
    # A full-stack match would call 1, 2 and 5 outliers; the user-frame level does not.
    lay = parse_layout("dp=8", ranks_per_node=1)
    result = analyze(synthetic_capture(lay, {1: "wrapper", 2: "wrapper", 5: "blocked"}), lay)
    assert result.level == "user"
    assert result.outlier_ranks == [5]
    forced = analyze(synthetic_capture(lay, {1: "wrapper", 2: "wrapper", 5: "blocked"}), lay,
                     AnalyzeOptions(levels=("main",)))
    assert forced.outlier_ranks == [1, 2, 5]


def test_a_difference_only_in_native_frames_is_found_at_a_finer_level():
    lay = parse_layout("dp=8", ranks_per_node=1)
    result = analyze(synthetic_capture(lay, {6: "native"}), lay)
    assert result.level == "main"
    assert result.outlier_ranks == [6]


def test_stuck_data_loader_child_and_failed_dump_are_outliers():
    lay = parse_layout("dp=8", ranks_per_node=2)
    assert analyze(synthetic_capture(lay, {4: "loader"}), lay).nodes == ["node2"]
    result = analyze(synthetic_capture(lay, {7: "timeout"}), lay)
    assert result.outlier_ranks == [7]
    text = explain(result)
    assert "timeout" in text and "OUTLIER" in text


def test_child_differences_alone_single_out_the_rank():
    lay = parse_layout("dp=4", ranks_per_node=1)
    dumps = synthetic_capture(lay)
    stuck = synthetic_rank(2, "node2", "loader").processes[1]
    dumps[2].processes[1] = stuck  # worker looks healthy; its child is in __getitem__
    assert analyze(dumps, lay).outlier_ranks == [2]


def test_a_missing_rank_is_an_outlier_named_by_layout_node():
    lay = parse_layout("dp=8", ranks_per_node=2)
    dumps = [d for d in synthetic_capture(lay) if d.rank != 6]
    result = analyze(dumps, lay)
    assert result.missing_ranks == [6]
    assert result.outlier_ranks == [6]
    assert result.nodes == ["node3"]


def test_uniform_and_inconclusive():
    lay = parse_layout("dp=8", ranks_per_node=2)
    uniform = analyze(synthetic_capture(lay), lay)
    assert uniform.verdict == "uniform" and uniform.nodes == []
    half = {r: "blocked" for r in range(4)}
    split = analyze(synthetic_capture(lay, half), lay)
    assert split.verdict == "inconclusive" and split.eviction is None


def test_mostly_failed_capture_is_inconclusive_not_uniform():
    lay = parse_layout("dp=4", ranks_per_node=1)
    result = analyze(synthetic_capture(lay, {r: "timeout" for r in range(3)}), lay)
    assert result.verdict == "inconclusive"
    assert "no stack for 3 of 4" in result.reason


def test_line_numbers_can_be_ignored():
    lay = parse_layout("dp=4", ranks_per_node=1)
    dumps = synthetic_capture(lay)
    main = dumps[1].processes[0].threads[0]
    main.frames = [Frame(f.name, f.file, f.line + 1, f.native) for f in main.frames]
    assert analyze(dumps, lay).outlier_ranks == [1]
    loose = AnalyzeOptions(signature=SignatureOptions(keep_lines=False))
    assert analyze(dumps, lay, loose).verdict == "uniform"


def test_without_layout_the_job_is_data_parallel_over_the_ranks_seen():
    dumps = synthetic_capture(ParallelLayout(dp=6, ranks_per_node=3), {4: "blocked"})
    result = analyze(dumps)
    assert result.layout.world_size == 6
    assert result.nodes == ["node1"]


def test_layout_mismatch_and_duplicates_are_refused():
    dumps = synthetic_capture(ParallelLayout(dp=8, ranks_per_node=1))
    with pytest.raises(UsageError, match="outside layout"):
        analyze(dumps, ParallelLayout(dp=4))
    with pytest.raises(UsageError, match="twice"):
        analyze(dumps + dumps[:1], ParallelLayout(dp=8))
    with pytest.raises(UsageError):
        AnalyzeOptions(levels=("nope",))


def test_json_output_is_serialisable_and_explains_the_decision():
    lay = parse_layout("tp=2,pp=2,dp=2", ranks_per_node=2)
    out = json.loads(json.dumps(analyze(synthetic_capture(lay, {5: "blocked"}), lay).to_json()))
    assert out["verdict"] == "evict"
    assert out["eviction"]["dim"] == "pp" and out["eviction"]["groups"] == [[1, 5]]
    assert out["groups"][0]["healthy"] and not out["groups"][1]["healthy"]
    assert out["groups"][1]["example"][0]["frames"][0].startswith("train_step (")
    assert out["levels_tried"][0]["level"] == "user"


def test_compress_ranks():
    assert compress_ranks([0, 1, 2, 4, 6, 7]) == "0-2,4,6-7"
    assert compress_ranks([]) == ""
