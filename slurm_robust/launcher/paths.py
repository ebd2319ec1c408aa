"""Every path of a run, in one place.

Shared (the run directory, visible from every node)::

    <run_dir>/config.json              the RunConfig (written by submit/launch)
    <run_dir>/events.jsonl             event log (slurm_robust.event; one writer, the controller)
    <run_dir>/state.json               persisted run state (attempts, restarts, signatures)
    <run_dir>/verdicts.jsonl           node verdicts (slurm_robust.verdict) for the epilog
    <run_dir>/controller.json          where the controller of the current step listens
    <run_dir>/agents/<node>.json       {"node", "agent_pid", "workers": {rank: pid}, ...}
    <run_dir>/logs/attempt<a>/gen<g>/rank<r>.log  each worker's stdout and stderr
    <run_dir>/stacks/<capture>/...     stack dumps taken before a hang is killed
    <run_dir>/ckpt/                    durable checkpoint tier
    <run_dir>/submitit/                submitit's folder (pickles, Slurm logs)
    <run_dir>/inject/                  one-shot injection requests (see inject.py)

Node-local (under the site's ``shm_root`` for the node)::

    <shm_root>/<job>/<node>/launcher/rank<r>.jsonl   the worker-to-agent progress channel
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from slurm_robust.run_dir_trust import read_trusted_json, run_dir_owner
from slurm_robust.secure_fs import UnsafePathError
from slurm_robust.site_config import CONFIG_ENV, SiteConfig, load_site_config

#: The job's Slurm comment names its run directory (set at submission, or by `launch`).
COMMENT_PREFIX = "slurm_robust:run_dir="


def run_dir_from_comment(comment: str) -> str | None:
    return comment[len(COMMENT_PREFIX):] if comment.startswith(COMMENT_PREFIX) else None


CLUSTER_DIR_ENV = "SLURM_ROBUST_CLUSTER_DIR"


@dataclass(frozen=True)
class RunPaths:
    """The shared paths of one run directory."""

    root: Path

    @classmethod
    def of(cls, run_dir: str | os.PathLike[str]) -> RunPaths:
        return cls(Path(run_dir))

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def verdicts(self) -> Path:
        return self.root / "verdicts.jsonl"

    @property
    def controller(self) -> Path:
        return self.root / "controller.json"

    @property
    def agents(self) -> Path:
        return self.root / "agents"

    def agent_file(self, node: str) -> Path:
        return self.agents / f"{node}.json"

    def worker_log(self, gen: int, rank: int, attempt: int = 0) -> Path:
        # Per attempt: generation numbers restart with every allocation (a requeue), so
        # gen<g> alone would append a requeued attempt's output to the first one's file.
        return self.root / "logs" / f"attempt{attempt}" / f"gen{gen}" / f"rank{rank}.log"

    @property
    def stacks(self) -> Path:
        return self.root / "stacks"

    @property
    def durable(self) -> Path:
        return self.root / "ckpt"

    @property
    def submitit(self) -> Path:
        return self.root / "submitit"

    @property
    def inject(self) -> Path:
        return self.root / "inject"

    def read_agents(self, owner: int | None = None) -> dict[str, dict]:
        """Every published agent file, by node (unreadable ones are skipped: a file being
        replaced is retried by the caller's next poll). ``owner``: the run's user (default
        the caller); a file of anyone else, or one others could write, is skipped too:
        its pids are what `inject` signals. Root reading a directory named to it trusts
        the directory's owner (run_dir_trust.run_dir_owner)."""
        out: dict[str, dict] = {}
        try:
            uid = run_dir_owner(self.root, owner)
        except OSError:
            return out
        for path in sorted(self.agents.glob("*.json")):
            try:
                obj = read_trusted_json(path, uid)
            except (OSError, ValueError, UnsafePathError):
                continue
            if isinstance(obj, dict):
                out[path.stem] = obj
        return out


def site_config_path(explicit: str | None = None) -> str | None:
    """The site config to use: explicit, ``$SLURM_ROBUST_CONFIG``, the mini-cluster's
    (``$SLURM_ROBUST_CLUSTER_DIR/etc/slurm_robust.json``), else None (the default path)."""
    if explicit:
        return explicit
    if os.environ.get(CONFIG_ENV):
        return os.environ[CONFIG_ENV]
    cluster = os.environ.get(CLUSTER_DIR_ENV)
    if cluster and (Path(cluster) / "etc" / "slurm_robust.json").exists():
        return str(Path(cluster) / "etc" / "slurm_robust.json")
    return None


def load_site(explicit: str | None = None) -> SiteConfig:
    path = site_config_path(explicit)
    return load_site_config(path) if path else load_site_config()


def node_shm_root(site: SiteConfig, node: str) -> Path:
    return site.node_path(site.shm_root, node)


def node_local_root(site: SiteConfig, node: str) -> Path:
    return site.node_path(site.local_root, node)


def progress_dir(site: SiteConfig, job_id: str, node: str) -> Path:
    return node_shm_root(site, node) / job_id / node / "launcher"
