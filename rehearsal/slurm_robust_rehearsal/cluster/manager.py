"""``cluster up|down|status``: bring the embedded Slurm mini-cluster up and down.

``up`` is idempotent: daemons already running are left alone, config files are only
rewritten when their content changes (then slurmctld is told to reconfigure).
``down`` cancels the cluster's jobs and stops exactly the processes it started.
"""

from __future__ import annotations

import logging
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

from slurm_robust.records import write_bytes_atomic
from slurm_robust.reserve.config import reserve_config
from slurm_robust.reserve.verdicts import ensure_verdict_root
from slurm_robust.site_config import load_site_config
from slurm_robust.slurm.runner import NO_RETRY, RetryPolicy, run_slurm_command
from slurm_robust_rehearsal.cluster import netns
from slurm_robust_rehearsal.cluster import prometheus as prom
from slurm_robust_rehearsal.cluster.config import REPO_ROOT, ClusterConfig
from slurm_robust_rehearsal.cluster.daemons import (
    ClusterError,
    Daemon,
    our_processes,
    start_daemon,
    stop_pids,
    tail,
    wait_for,
)
from slurm_robust_rehearsal.cluster.prometheus import PACKAGE
from slurm_robust_rehearsal.cluster.templates import (
    NODE_PROGRAMS,
    SPANK_PLUGIN,
    render_plugstack_conf,
    render_robust_conf,
    render_slurm_conf,
    render_slurmdbd_conf,
    wrapper_files,
)

log = logging.getLogger("slurm_robust_rehearsal.cluster")

#: The subreaper each slurmd runs under (a file, run by path: it imports nothing).
REAPER = Path(__file__).with_name("reaper.py")

# Debian 12 packages and a program each provides, to tell what is missing.
PACKAGES: dict[str, str] = {
    "slurmctld": "/usr/sbin/slurmctld",
    "slurmd": "/usr/sbin/slurmd",
    "slurmdbd": "/usr/sbin/slurmdbd",
    "slurm-client": "/usr/bin/sbatch",
    "munge": "/usr/sbin/munged",
    "mariadb-server": "/usr/sbin/mariadbd",
    "libslurm-dev": "/usr/include/slurm/spank.h",
    # `ip` makes the per-node network namespaces, the default mode where root can.
    "iproute2": "/usr/sbin/ip",
}
APT_TIMEOUT_S = 1200


@dataclass
class UpReport:
    seconds: float
    started: list[str]
    already_running: list[str]
    notices: tuple[str, ...] = ()


def missing_packages(prometheus: bool = False) -> list[str]:
    wanted = dict(PACKAGES)
    if prometheus:  # opt-in (cluster up --prometheus): see cluster/prometheus.py
        wanted[PACKAGE[0]] = PACKAGE[1]
    return [pkg for pkg, path in wanted.items() if not Path(path).exists()]


def install_packages(packages: list[str]) -> None:
    """apt-get install what is missing (root only); says what to run otherwise."""
    if not packages:
        return
    if os.geteuid() != 0:
        raise ClusterError("missing Debian packages " + " ".join(packages) +
                           "; run as root: apt-get install -y " + " ".join(packages))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]):
        proc = subprocess.run(argv, env=env, capture_output=True, text=True,
                              timeout=APT_TIMEOUT_S, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise ClusterError(f"`{' '.join(argv)}` failed: {proc.stderr.strip()[-400:]}")


def ensure_user(name: str) -> None:
    """Create the unprivileged account used to test non-root jobs."""
    try:
        pwd.getpwnam(name)
        return
    except KeyError:
        pass
    if os.geteuid() != 0:
        raise ClusterError(f"user {name!r} does not exist; run `useradd -m {name}` as root")
    made = subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name],
                          capture_output=True, text=True, timeout=30, check=False)
    if made.returncode != 0:
        try:
            pwd.getpwnam(name)  # another cluster's `up` on this host made it first
        except KeyError:
            raise ClusterError(f"useradd {name} failed: {made.stderr.strip()[-300:]}") from None


def ensure_system_user(name: str) -> tuple[int, int]:
    """The daemon account SlurmUser (Debian's slurm packages create ``slurm``): uid, gid."""
    try:
        pw = pwd.getpwnam(name)
        return pw.pw_uid, pw.pw_gid
    except KeyError:
        pass
    if os.geteuid() != 0:
        raise ClusterError(f"SlurmUser {name!r} does not exist; run "
                           f"`useradd --system --no-create-home {name}` as root")
    subprocess.run(["useradd", "--system", "--no-create-home", "--user-group", "--shell",
                    "/usr/sbin/nologin", name], check=True, capture_output=True, timeout=30)
    pw = pwd.getpwnam(name)
    return pw.pw_uid, pw.pw_gid


def _chown_tree(top: Path, uid: int, gid: int) -> None:
    """chown ``top`` and everything below it (without following links)."""
    os.chown(top, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def ensure_reachable(paths: list[Path]) -> list[Path]:
    """Give "others" search (x) permission on the ancestors of ``paths`` that lack it.

    The unprivileged test user must be able to run the venv's interpreter (under
    /root/.pyenv on this kind of machine, and /root is 0700) and read the checkout.
    Only the search bit is added, never read or write; returns the directories changed.
    """
    changed: list[Path] = []
    for path in paths:
        for d in reversed(Path(path).resolve().parents):
            try:
                mode = d.stat().st_mode
            except OSError:
                continue
            if not mode & 0o001:
                d.chmod((mode & 0o7777) | 0o001)
                changed.append(d)
    return changed


def _write_if_changed(path: Path, content: str, mode: int = 0o644) -> bool:
    try:
        if path.read_text() == content:
            return False
    except FileNotFoundError:
        pass
    write_bytes_atomic(path, [content.encode()], mode, durable=False)
    os.chmod(path, mode)  # exactly, whatever the umask
    return True


def choose_network(cfg: ClusterConfig) -> tuple[ClusterConfig, str | None]:
    """``cfg`` with the network mode an ``up`` that names none should take, and a one-line
    notice when that is not the namespaced mode.

    A cluster already running keeps its mode (switching needs a ``down``). Otherwise each
    node gets its own namespace and address wherever namespaces can be made (root,
    iproute2), since that is the layout of a real cluster; elsewhere all nodes share
    127.0.0.1, and the notice says why.
    """
    saved = cfg.saved_netns()
    if saved is not None and any(MiniCluster(cfg).running().values()):
        return replace(cfg, netns=saved), None
    why = netns.unavailable_reason()
    if why is None:
        return replace(cfg, netns=True), None
    return (replace(cfg, netns=False),
            f"mini-cluster: every node on 127.0.0.1 (shared network): {why}")


class MiniCluster:
    """The mini-cluster described by a ClusterConfig."""

    def __init__(self, cfg: ClusterConfig | None = None) -> None:
        self.cfg = cfg or ClusterConfig()

    # --- daemons ---------------------------------------------------------------------
    def daemons(self) -> list[Daemon]:
        c = self.cfg
        run, logs = c.run_dir, c.log_dir
        mysql = c.mysql_dir
        ds = [
            Daemon("munged", ("munged", "-F", "--force", f"--socket={c.munge_socket}",
                              f"--key-file={c.munge_key}", f"--pid-file={run}/munged.pid",
                              f"--log-file={logs}/munged.log",
                              f"--seed-file={c.munge_dir}/munge.seed"),
                   run / "mc-munged.pid", logs / "munged.out"),
            Daemon("mariadb", ("mariadbd", "--no-defaults", "--user=root",
                               f"--datadir={mysql}/data", f"--socket={c.mysql_socket}",
                               f"--port={c.mysql_port}", "--bind-address=127.0.0.1",
                               f"--pid-file={run}/mariadbd.pid",
                               f"--log-error={logs}/mariadb.log",
                               "--innodb-buffer-pool-size=128M",
                               "--innodb-log-file-size=64M",
                               "--innodb-lock-wait-timeout=900"),
                   run / "mc-mariadb.pid", logs / "mariadb.out"),
            Daemon("slurmdbd", ("slurmdbd", "-D"), run / "mc-slurmdbd.pid",
                   logs / "slurmdbd.out"),
            Daemon("slurmctld", ("slurmctld", "-D", "-i"), run / "mc-slurmctld.pid",
                   logs / "slurmctld.out"),
        ]
        for node in c.nodes:
            # netns mode: slurmd (and so every job process on the node) in the node's
            # own network namespace.
            # Under a reaper: every orphan of the node's jobs reaped at once (reaper.py).
            argv = (*netns.exec_prefix(c, node), c.python, str(REAPER), "slurmd", "-D",
                    "-N", node)
            ds.append(Daemon(f"slurmd-{node}", argv,
                             run / f"mc-slurmd-{node}.pid", logs / f"slurmd-{node}.out"))
        return ds

    def daemon(self, name: str) -> Daemon:
        for d in self.daemons():
            if d.name == name:
                return d
        raise ClusterError(f"no daemon named {name!r}")

    def reboot_node(self, node: str) -> int:
        """The mini-cluster's reboot of ``node``: its slurmd stopped and started again,
        as a rebooted machine's would be (its nodes share one kernel, so nothing else
        restarts). Slurm sees the node register anew and keeps its drain and reason.
        Returns the new slurmd's pid. The break-fix loop's reboot command here
        (health/repair.py; ``slurm-robust cluster reboot --node NODE``)."""
        if node not in self.cfg.nodes:
            raise ClusterError(f"no node {node!r} in this mini-cluster "
                               f"({', '.join(self.cfg.nodes)})")
        daemon = self.daemon(f"slurmd-{node}")
        pid = daemon.pid(self.cfg.root)
        if pid is not None and stop_pids([pid], self.cfg.root):
            raise ClusterError(f"slurmd of {node} (pid {pid}) would not stop")
        return start_daemon(daemon, self.cfg.root, self.cfg.env())

    def running(self) -> dict[str, int | None]:
        return {d.name: d.pid(self.cfg.root) for d in self.daemons()}

    # --- up --------------------------------------------------------------------------
    def up(self, install: bool = True, timeout_s: float = 120.0,
           prometheus: bool = False) -> UpReport:
        start = time.monotonic()
        missing = missing_packages(prometheus)
        if missing:
            if not install:
                raise ClusterError("missing Debian packages: " + " ".join(missing))
            install_packages(missing)
        self._check_mode()
        ensure_user(self.cfg.user)
        # A second unprivileged user, for the multi-user security tests.
        ensure_user(self.cfg.attacker)
        if os.geteuid() == 0:
            for d in ensure_reachable([Path(self.cfg.python), REPO_ROOT, self.cfg.root]):
                log.warning("added o+x to %s so user %r can reach it", d, self.cfg.user)
        notices: list[str] = []
        if self.cfg.netns:
            subnet, notice = netns.free_subnet(self.cfg)
            if notice:
                log.info("%s", notice)
                notices.append(notice)
            self.cfg = replace(self.cfg, netns_subnet=subnet)
        conf_changed = self._write_files()
        if self.cfg.netns:  # the bridge first: slurmctld's address lives on it
            netns.create(self.cfg)
        self._hand_to_slurm_user()
        before = self.running()
        env = self.cfg.env()
        self._start_munge(env)
        self._start_mariadb(env)
        self._start_slurmdbd(env)
        self._start_slurmctld(env, reconfigure=conf_changed)
        for node in self.cfg.nodes:
            start_daemon(self.daemon(f"slurmd-{node}"), self.cfg.root, env)
        self._wait_nodes_ready(timeout_s)
        if prometheus:
            prom.start(self.cfg, env)
        after = self.running()
        started = [n for n, pid in after.items() if before.get(n) is None and pid]
        already = [n for n, pid in before.items() if pid]
        return UpReport(time.monotonic() - start, started, already, tuple(notices))

    def _check_mode(self) -> None:
        """Refuse to switch network modes under running daemons (slurmds would stay in
        the old mode); a stopped cluster may come up in either."""
        saved = self.cfg.saved_netns()
        if saved is None or saved == self.cfg.netns or not any(self.running().values()):
            return
        now, asked = ("--netns" if saved else "--shared-net",
                      "--netns" if self.cfg.netns else "--shared-net")
        raise ClusterError(f"the mini-cluster is up with {now}; run `slurm-robust cluster "
                           f"down` before `cluster up {asked}`")

    def start_reserve_timer(self, every_s: float) -> int:
        """Run ``reserve reconcile`` now and every ``every_s`` s (slurm_robust.reserve.timer),
        as a daemon of this cluster (stopped by ``down`` with everything that carries the
        cluster marker): spares are fresh before the first handoff. Returns its pid."""
        c = self.cfg
        timer = Daemon("reserve-timer", (c.python, "-m", "slurm_robust.reserve.timer",
                                         "--every", f"{every_s:g}", "--config",
                                         str(c.robust_conf)),
                       c.run_dir / "mc-reserve-timer.pid", c.log_dir / "reserve-timer.out")
        return start_daemon(timer, c.root, c.env())

    def _write_files(self) -> bool:
        c = self.cfg
        for d in (c.etc, c.run_dir, c.log_dir, c.bin_dir, c.ctld_state, c.shared_dir):
            d.mkdir(parents=True, exist_ok=True)
        # The unprivileged user must read configs and use the munge socket and shared dir.
        for d in (c.root, c.etc, c.root / "nodes"):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o755)
        c.shared_dir.chmod(0o1777)
        for node in c.nodes:
            nd = c.node_dir(node)
            for sub in ("spool", "state", "shm", "local", "tmp"):
                (nd / sub).mkdir(parents=True, exist_ok=True)
            for sub in ("shm", "local", "tmp"):
                (nd / sub).chmod(0o1777)
            # The checkpoint's node-local shared level (<local_root>/<node>), made by root
            # as a site would: left to the first comer, another user could own it and
            # every robust job would refuse the node. A squatter's copy is moved aside.
            level = nd / "local" / node
            if level.is_symlink() or (level.exists() and level.stat().st_uid != 0):
                level.rename(level.with_name(f".{node}.squatted-{int(time.time())}"))
            level.mkdir(exist_ok=True)
            level.chmod(0o1777)
        programs = {k: p for k, p in NODE_PROGRAMS.items() if p.exists()}
        plugin = SPANK_PLUGIN if SPANK_PLUGIN.exists() else None
        changed = False
        changed |= _write_if_changed(c.slurm_conf, render_slurm_conf(c, programs))
        c.save_shape()
        changed |= _write_if_changed(c.plugstack_conf, render_plugstack_conf(c, plugin))
        password_file = c.etc / "db.password"
        if not password_file.exists():
            _write_if_changed(password_file, secrets.token_hex(16), 0o600)
        _write_if_changed(c.slurmdbd_conf,
                          render_slurmdbd_conf(c, password_file.read_text().strip()), 0o600)
        _write_if_changed(c.robust_conf, render_robust_conf(c))
        self._ensure_verdict_spool()
        for path, text in wrapper_files(c, programs).items():
            changed |= _write_if_changed(path, text, 0o755)
        return changed

    def _ensure_verdict_spool(self) -> None:
        """The spool where jobs leave verdicts for EpilogSlurmctld (root:SlurmUser's group,
        0755; per-user directories in it are made by the root node prolog).

        An admin creates it once on a real cluster; without it a job's first verdicts
        could not be handed to the slurmctld side.
        """
        site = load_site_config(self.cfg.robust_conf)
        gid = pwd.getpwnam(self.cfg.slurm_user).pw_gid if os.geteuid() == 0 else None
        ensure_verdict_root(Path(reserve_config(site).verdict_root), gid)

    def _hand_to_slurm_user(self) -> None:
        """Give SlurmUser what slurmctld and slurmdbd write: their state and config, and
        the log directory (root:slurm, setgid, group-writable) where the controller-side
        programs (EpilogSlurmctld) append the verdict and reserve logs."""
        if os.geteuid() != 0:
            return
        c = self.cfg
        uid, gid = ensure_system_user(c.slurm_user)
        _chown_tree(c.ctld_state, uid, gid)
        c.ctld_state.chmod(0o700)
        os.chown(c.slurmdbd_conf, uid, gid)  # slurmdbd insists: owned by SlurmUser, 0600
        os.chown(c.log_dir, 0, gid)
        c.log_dir.chmod(0o2775)
        os.chown(c.run_dir, 0, gid)
        c.run_dir.chmod(0o2775)  # slurmctld/slurmdbd write their pid files as SlurmUser
        for path in c.log_dir.iterdir():
            if path.is_file() and not path.is_symlink() and path.name.endswith(
                    (".jsonl", ".lock")) or path.name in ("slurmctld.log", "slurmdbd.log"):
                os.chown(path, uid if path.name.endswith(".log") else 0, gid)
                path.chmod(0o664 if not path.name.endswith(".log") else 0o640)
        # The node ledger's directory (the site config puts it in the log directory) made
        # here as an admin's install would: root's, SlurmUser's group, 2770. Left to its
        # first writer, EpilogSlurmctld (SlurmUser) could make it, and root's programs then
        # refuse a directory they do not own (every ledger write after fails); a directory
        # an earlier `up` left that way is given back to root.
        ledger = c.ledger_dir
        ledger.mkdir(mode=0o700, exist_ok=True)
        if ledger.is_dir() and not ledger.is_symlink():
            _chown_tree(ledger, 0, gid)
            ledger.chmod(0o2770)

    def _start_munge(self, env: dict[str, str]) -> None:
        c = self.cfg
        c.munge_dir.mkdir(parents=True, exist_ok=True)
        c.munge_dir.chmod(0o755)
        if not c.munge_key.exists():
            fd = os.open(c.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(secrets.token_bytes(1024))
        start_daemon(self.daemon("munged"), c.root, env)
        wait_for("munged socket", c.munge_socket.exists, 15,
                 hint=tail(c.log_dir / "munged.out"))

    def _start_mariadb(self, env: dict[str, str]) -> None:
        c = self.cfg
        data = c.mysql_dir / "data"
        fresh = not (data / "mysql").exists()
        if fresh:
            data.mkdir(parents=True, exist_ok=True)
            proc = subprocess.run(
                ["mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={data}",
                 "--auth-root-authentication-method=normal", "--skip-test-db"],
                capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
            if proc.returncode != 0:
                raise ClusterError(f"mariadb-install-db failed: {proc.stderr.strip()[-400:]}")
        start_daemon(self.daemon("mariadb"), c.root, env)
        wait_for("MariaDB", lambda: _port_open(c.mysql_port), 60,
                 hint=tail(c.log_dir / "mariadb.log"))
        password = (c.etc / "db.password").read_text().strip()
        sql = (f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';"
               f"CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '{password}';"
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';")
        proc = subprocess.run(["mariadb", "--no-defaults", f"--socket={c.mysql_socket}",
                               "-uroot", "-e", sql], capture_output=True, text=True,
                              timeout=30, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise ClusterError(f"creating the slurm database user failed: {proc.stderr.strip()}")

    def _start_slurmdbd(self, env: dict[str, str]) -> None:
        c = self.cfg
        start_daemon(self.daemon("slurmdbd"), c.root, env)
        wait_for("slurmdbd", lambda: _port_open(c.dbd_port), 60,
                 hint=tail(c.log_dir / "slurmdbd.log"))
        out = run_slurm_command(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"],
                                env=env).stdout.split()
        if c.name not in out:
            run_slurm_command(["sacctmgr", "-i", "add", "cluster", c.name], env=env)

    def _start_slurmctld(self, env: dict[str, str], reconfigure: bool) -> None:
        c = self.cfg
        ctld = self.daemon("slurmctld")
        pid = ctld.pid(c.root)
        if pid is not None and reconfigure:
            # Some settings (AuthInfo's cred_expire) are read only at slurmctld start;
            # a restart keeps jobs (state is saved) and takes a few seconds.
            stop_pids([pid], c.root)
        was_running = pid is not None
        start_daemon(ctld, c.root, env)
        quick = RetryPolicy(attempts=1, timeout_s=5)
        wait_for("slurmctld", lambda: run_slurm_command(
            ["scontrol", "ping"], env=env, policy=quick, check=False).returncode == 0, 60,
            hint=tail(c.log_dir / "slurmctld.log"))
        if was_running and reconfigure:
            run_slurm_command(["scontrol", "reconfigure"], env=env)

    def stop_slurmctld(self) -> None:
        """Stop slurmctld alone (a rehearsal of a controller outage; jobs keep running)."""
        pid = self.daemon("slurmctld").pid(self.cfg.root)
        if pid is not None:
            stop_pids([pid], self.cfg.root)

    def start_slurmctld(self) -> None:
        """Start slurmctld again after :meth:`stop_slurmctld` (waits until it answers)."""
        self._start_slurmctld(self.cfg.env(), reconfigure=False)

    def _wait_nodes_ready(self, timeout_s: float) -> None:
        env = self.cfg.env()
        quick = RetryPolicy(attempts=1, timeout_s=10)

        def ready() -> bool:
            out = run_slurm_command(["sinfo", "-h", "-N", "-o", "%N %t"], env=env,
                                    policy=quick, check=False).stdout
            states = dict(line.split() for line in out.splitlines() if line.strip())
            if set(states) != set(self.cfg.nodes):
                return False
            # Ready: every node answers (no '*'), none still unknown or powering up.
            return all(not s.endswith("*") and not s.startswith(("unk", "pow", "boot"))
                       for s in states.values())

        wait_for("every node to register", ready, timeout_s,
                 hint="see " + str(self.cfg.log_dir / "slurmd-<node>.log"))

    # --- down ------------------------------------------------------------------------
    def down(self, timeout_s: float = 30.0) -> list[int]:
        """Cancel every job, stop every daemon; returns pids that would not die."""
        c = self.cfg
        env = c.env()
        if self.daemon("slurmctld").pid(c.root) is not None:
            jobs = run_slurm_command(["squeue", "-h", "-o", "%i"], env=env, policy=NO_RETRY,
                                     check=False).stdout.split()
            if jobs:
                run_slurm_command(["scancel", *jobs], env=env, policy=NO_RETRY, check=False)
                try:
                    wait_for("jobs to end", lambda: not run_slurm_command(
                        ["squeue", "-h", "-o", "%i"], env=env, policy=NO_RETRY,
                        check=False).stdout.split(), timeout_s)
                except ClusterError as exc:
                    log.warning("%s; stopping anyway", exc)
        # Reverse start order: slurmd, slurmctld, slurmdbd, mariadb, munged.
        for d in reversed(self.daemons()):
            pid = d.pid(c.root)
            if pid is not None:
                stop_pids([pid], c.root)
            d.pidfile.unlink(missing_ok=True)
        unlink_default_munge_socket(c.munge_socket)
        # Anything left that carries our marker (slurmstepd, a stray daemon child).
        survivors = stop_pids(our_processes(c.root), c.root)
        # Namespaces, veths and the bridge of a netns cluster, found by name (so also
        # after a crash, and whichever mode this `down` was asked in).
        for item in netns.destroy(c):
            log.info("removed %s", item)
        return survivors

    def status(self) -> dict[str, object]:
        running = self.running()
        nodes: dict[str, str] = {}
        if running.get("slurmctld"):
            out = run_slurm_command(["sinfo", "-h", "-N", "-o", "%N %P %t"],
                                    env=self.cfg.env(), policy=NO_RETRY, check=False).stdout
            for line in out.splitlines():
                parts = line.split()
                if len(parts) == 3:
                    nodes[parts[0]] = f"{parts[2]} ({parts[1]})"
        return {"root": str(self.cfg.root), "daemons": running, "nodes": nodes,
                "up": all(running.values())}

    def wipe(self) -> None:
        """Remove the cluster directory (only when nothing of it runs)."""
        if any(self.running().values()) or our_processes(self.cfg.root):
            raise ClusterError("cluster is running; run `slurm-robust cluster down` first")
        shutil.rmtree(self.cfg.root, ignore_errors=True)


# munge's compiled-in socket. Slurm's connections to slurmdbd (slurmctld's, sacct's,
# sacctmgr's) ignore AuthInfo=socket= and use this path unless AccountingStoragePass names
# a socket; slurm.conf names ours, so nothing here links this host-wide path any more (it
# can reach one cluster's munged only: a second cluster on the host that re-pointed it
# made the first one's sacct fail with "DBD_GET_JOBS_COND failure"). A link an earlier
# version left to this cluster's socket is removed by `down`.
DEFAULT_MUNGE_SOCKET = Path("/run/munge/munge.socket.2")


def unlink_default_munge_socket(ours: Path) -> None:
    link = DEFAULT_MUNGE_SOCKET
    if link.is_symlink() and Path(os.readlink(link)) == ours:
        link.unlink()


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
