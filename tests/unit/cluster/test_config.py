"""The mini-cluster's generated configs say what the design needs."""

from pathlib import Path

from slurm_robust_rehearsal.cluster.config import ClusterConfig
from slurm_robust_rehearsal.cluster.templates import (
    render_plugstack_conf,
    render_slurm_conf,
    render_wrapper,
)


def _cfg(tmp_path: Path) -> ClusterConfig:
    return ClusterConfig(root=tmp_path / "mc", python="/opt/py bin/python")


def test_slurm_conf_has_nodes_partitions_and_programs(tmp_path):
    cfg = _cfg(tmp_path)
    prog = {"Prolog": Path("/repo/prolog/prolog.py")}
    text = render_slurm_conf(cfg, prog)
    assert "PartitionName=train Nodes=node[1-4] Default=YES" in text
    assert "PartitionName=standby Nodes=spare[1-2]" in text
    assert "NodeName=spare2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=17006" in text
    assert "SchedulerParameters=nohold_on_prolog_fail," in text
    assert ",cred_expire=20" in text
    assert f"Prolog={cfg.bin_dir / 'prolog'}" in text
    assert "Epilog=" not in text  # only programs present in the checkout are wired
    assert f"SlurmdSpoolDir={cfg.root}/nodes/%n/spool" in text


def test_wrapper_quotes_paths_and_isolates_python(tmp_path):
    cfg = _cfg(tmp_path)
    text = render_wrapper(cfg, Path("/repo dir/prolog/prolog.py"))
    assert "exec '/opt/py bin/python' -I '/repo dir/prolog/prolog.py' \"$@\"" in text
    assert f"SLURM_ROBUST_CONFIG={cfg.robust_conf}" in text


def test_plugstack_only_loads_a_built_plugin(tmp_path):
    cfg = _cfg(tmp_path)
    assert "optional" not in render_plugstack_conf(cfg, None)
    assert "optional /x.so journal=" in render_plugstack_conf(cfg, Path("/x.so"))


def test_ensure_reachable_adds_only_the_search_bit(tmp_path):
    from slurm_robust_rehearsal.cluster.manager import ensure_reachable

    private = tmp_path / "home"
    target = private / "venv" / "bin"
    target.mkdir(parents=True)
    private.chmod(0o700)
    (private / "venv").chmod(0o750)
    changed = ensure_reachable([target / "python"])
    assert private in changed and private / "venv" in changed
    assert private.stat().st_mode & 0o777 == 0o701
    assert (private / "venv").stat().st_mode & 0o777 == 0o751
    assert ensure_reachable([target / "python"]) == []


def test_sized_cluster_renders_its_partitions_and_remembers_its_shape(tmp_path):
    import pytest

    cfg = _cfg(tmp_path).sized(5, 1)
    text = render_slurm_conf(cfg, {})
    assert "PartitionName=train Nodes=node[1-5] Default=YES" in text
    assert "PartitionName=standby Nodes=spare1 " in text
    assert "NodeName=spare1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=17006" in text
    cfg.etc.mkdir(parents=True)
    cfg.save_shape()
    again = _cfg(tmp_path).with_saved_shape()
    assert again.train_nodes == cfg.train_nodes and again.spare_nodes == ("spare1",)
    assert _cfg(tmp_path / "other").with_saved_shape().nodes == _cfg(tmp_path).nodes
    with pytest.raises(ValueError, match="--nodes 0"):
        _cfg(tmp_path).sized(0, 1)
