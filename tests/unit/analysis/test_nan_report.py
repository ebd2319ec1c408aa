"""NaN incidents by resolution: counts per ladder resolution and the mean time
of each stage, read from the incidents' ``evidence.nan``."""

from __future__ import annotations

import pandas as pd
import pytest

from slurm_robust.analysis.nan import RESOLUTIONS, nan_by_resolution


def _inc(cls, nan=None, detect=1.0, recover=5.0):
    return {"class": cls, "evidence": {"nan": nan} if nan else {},
            "time_to_detect": detect, "time_to_localize": detect, "time_to_recover": recover}


def test_counts_every_resolution_and_stage_times():
    df = pd.DataFrame([
        _inc("nan", {"resolution": "reattempt"}, recover=4.0),
        _inc("nan", {"resolution": "stop", "replay_s": 6.0}),
        _inc("nan", {"resolution": "evict", "replay_s": 8.0,
                     "bitwise": {"seconds": 0.5}}, recover=9.0),
        _inc("nan", {"resolution": "replay", "replay": {"seconds": 31.5, "located": "n3"}}),
        _inc("nan"),  # before the ladder: no resolution
        _inc("worker_signal"),
    ])
    table = nan_by_resolution(df).set_index("resolution")
    assert list(table.index[:len(RESOLUTIONS)]) == list(RESOLUTIONS)
    assert table.loc["reattempt", "count"] == 1 and table.loc["skip", "count"] == 0
    assert table.loc["unknown", "count"] == 1
    assert table["count"].sum() == 5  # the worker_signal incident is not a NaN
    assert table.loc["replay", "mean_dual_replay_s"] == pytest.approx(31.5)
    assert table.loc["stop", "mean_replay_s"] == pytest.approx(6.0)
    assert table.loc["evict", "mean_bitwise_s"] == pytest.approx(0.5)
    assert table.loc["evict", "mean_time_to_recover"] == pytest.approx(9.0)
    assert pd.isna(table.loc["skip", "mean_time_to_recover"])


def test_no_incidents_gives_zero_rows():
    table = nan_by_resolution(pd.DataFrame())
    assert table["count"].sum() == 0 and len(table) == len(RESOLUTIONS)
