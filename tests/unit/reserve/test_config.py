"""The reserve section of the site config: defaults, derived paths, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.reserve.config import ReserveConfig, reserve_config
from slurm_robust.site_config import SiteConfig


def test_defaults_and_paths_derive_from_the_verdict_log() -> None:
    cfg = reserve_config(SiteConfig(verdict_log="/x/log/verdicts.jsonl"))
    assert cfg.partition == "standby" and cfg.train_partitions == ("train",)
    assert cfg.quantile == 0.99 and cfg.failure_prob_prior == 0.0012
    assert cfg.freshness_h == 24.0 and cfg.target is None
    assert cfg.lock_file == Path("/x/log/reserve.lock")
    assert cfg.verdict_root == Path("/x/log/verdicts")
    assert cfg.log_file == Path("/x/log/reserve.jsonl")


def test_values_and_overrides() -> None:
    site = SiteConfig(reserve={"train_partitions": ["gpu", "gpu2"], "target": 3,
                               "verdict_dir": "/shared/verdicts", "freshness_h": 6})
    cfg = reserve_config(site, target=5)
    assert cfg.train_partitions == ("gpu", "gpu2") and cfg.target == 5
    assert cfg.verdict_root == Path("/shared/verdicts") and cfg.freshness_h == 6.0


def test_unknown_key_lists_valid_keys_with_defaults() -> None:
    with pytest.raises(UsageError) as err:
        reserve_config(SiteConfig(reserve={"partiton": "standby"}))
    text = str(err.value)
    assert "partiton" in text and "partition='standby'" in text and "quantile=0.99" in text


@pytest.mark.parametrize("raw", [{"quantile": 1.0}, {"target": -1}, {"freshness_h": 0},
                                 {"partition": "train"}, {"train_partitions": []},
                                 {"quantile": "0.99"}, {"target": True},
                                 {"history_h": 1, "replacement_window_h": 24}])
def test_bad_values_are_refused(raw: dict) -> None:
    with pytest.raises(UsageError):
        reserve_config(SiteConfig(reserve=raw))


def test_dataclass_checks_relationships() -> None:
    with pytest.raises(UsageError):
        ReserveConfig(partition="train", train_partitions=("train",))
