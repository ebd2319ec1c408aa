"""Runtime analyzer: stack capture and aggregation, group eviction, fail-slow voting.

ByteRobust's answer to hangs and slowdowns that no log explains (section 3 of the
ByteRobust paper cited in README.md):

- :mod:`.capture` / :mod:`.runcapture`: dump every worker and its children (py-spy,
  or the faulthandler signal installed by :mod:`.handler`), stored per rank;
- :mod:`.analyze`: group normalised stacks (:mod:`.signature`), call the minority
  outliers, and name the parallel group they share (:mod:`.groups`) with its machines;
- :mod:`.failslow`: flag the slowest ranks' group every interval, evict by vote;
- :mod:`slurm_robust.layout`: TP/PP/DP coordinates (Megatron order), shared with ckpt.

Only standard-library modules are imported here; the training processes import
:mod:`.handler` through this package.
"""

from slurm_robust.layout import ParallelLayout, parse_layout
from slurm_robust.stacks.analyze import Analysis, AnalyzeOptions, analyze, explain
from slurm_robust.stacks.capture import CaptureOptions, CaptureResult, capture_local
from slurm_robust.stacks.dumps import RankDump, StackDumpError, read_capture
from slurm_robust.stacks.failslow import (
    FailSlowDecision,
    FailSlowMonitor,
    FailSlowOptions,
    flag_round,
    vote,
)
from slurm_robust.stacks.groups import Eviction, select_eviction
from slurm_robust.stacks.handler import install_stack_dump_handler

__all__ = [
    "AnalyzeOptions", "Analysis", "CaptureOptions", "CaptureResult", "Eviction",
    "FailSlowDecision", "FailSlowMonitor", "FailSlowOptions", "ParallelLayout", "RankDump",
    "StackDumpError", "analyze", "capture_local", "explain", "flag_round",
    "install_stack_dump_handler", "parse_layout", "read_capture", "select_eviction", "vote",
]
