"""The site config fails fast on mistakes instead of ignoring them."""

import json

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.site_config import SiteConfig, load_site_config, site_config_from_dict


def test_missing_default_file_means_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_ROBUST_CONFIG", str(tmp_path / "absent.json"))
    assert load_site_config() == SiteConfig()


def test_unknown_key_lists_valid_keys():
    with pytest.raises(UsageError, match=r"unknown key\(s\) \['state_dri'\].*state_dir="):
        site_config_from_dict({"state_dri": "/x"})


@pytest.mark.parametrize("raw", [{"gpus_per_node": "8"}, {"gpus_per_node": -1},
                                 {"gpus_per_node": True}, {"injection_enabled": "yes"},
                                 {"checks": []}])
def test_bad_types_are_refused(raw):
    with pytest.raises(UsageError):
        site_config_from_dict(raw)


def test_file_round_trip_and_node_paths(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"state_dir": str(tmp_path / "{node}" / "state"),
                                "gpus_per_node": 8}))
    cfg = load_site_config(path)
    assert cfg.gpus_per_node == 8
    assert cfg.state_path("node7") == tmp_path / "node7" / "state"


@pytest.mark.parametrize("node", ["../etc", "a/b", "", ".."])
def test_node_names_cannot_escape_the_state_dir(node):
    with pytest.raises(UsageError):
        SiteConfig().state_path(node)


def test_invalid_json_is_a_clear_error(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("{")
    with pytest.raises(UsageError, match="not valid JSON"):
        load_site_config(path)
