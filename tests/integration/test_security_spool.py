"""The verdict spool with a non-root SlurmUser, against a hostile second user.

slurmctld runs as ``slurm`` on the mini-cluster, as on real sites. ``mallory`` cannot
create any directory in the spool (so none of another user's), a squatted directory left
from a world-writable spool is replaced by the root prolog at ``robust``'s next job,
``mallory`` can neither list nor plant files in ``robust``'s spool, and SlurmUser (not
root) reads ``robust``'s verdict at the job's end.
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import wait_until

from slurm_robust.records import read_records
from slurm_robust.reserve.config import reserve_config
from slurm_robust.site_config import load_site_config

pytestmark = pytest.mark.integration

#: What mallory tries, printed one result per line.
MALLORY = textwrap.dedent("""
    import os, sys
    root, victim = sys.argv[1], sys.argv[2]
    for what, fn in (("mkdir", lambda: os.mkdir(os.path.join(root, "future_user"))),
                     ("plant", lambda: open(os.path.join(root, victim, "1.jsonl"), "w")),
                     ("list", lambda: os.listdir(os.path.join(root, victim)))):
        try:
            fn()
            print(what, "ALLOWED")
        except PermissionError:
            print(what, "refused")
""")

WRITE = textwrap.dedent("""
    import sys
    from pathlib import Path
    from slurm_robust.reserve.verdicts import write_verdict
    write_verdict(Path(sys.argv[1]), sys.argv[2], sys.argv[3], "node3",
                  "slurm_robust: gpu_xid: test", "gpu_memory_error")
""")


def run_as(user: str, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", user, "--", sys.executable, "-c", code, *args],
                          capture_output=True, text=True, timeout=60)


def test_spool_refuses_mallory_and_slurm_user_reads_the_verdicts(minicluster: Any) -> None:
    cfg, slurm = minicluster.cfg, minicluster.slurm
    site = load_site_config(cfg.robust_conf)
    root = reserve_config(site).verdict_root
    slurm_gid = pwd.getpwnam(cfg.slurm_user).pw_gid
    robust = pwd.getpwnam(cfg.user)
    mallory = pwd.getpwnam(cfg.attacker)
    st = root.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, slurm_gid, 0o755)
    assert "SlurmUser=slurm" in cfg.slurm_conf.read_text()

    # What mallory could do on a world-writable spool: hold robust's name first.
    own = root / cfg.user
    saved = root / f".saved.{cfg.user}"
    if own.exists():
        own.rename(saved)
    own.mkdir()
    os.chown(own, mallory.pw_uid, mallory.pw_gid)
    own.chmod(0o777)
    job = None
    try:
        job = subprocess.run(
            ["runuser", "-u", cfg.user, "--", "env", f"SLURM_CONF={cfg.slurm_conf}", "sbatch",
             "--parsable", "-N1", "-p", "train", "-o", "/dev/null", "-J", "spool-test",
             "--wrap", "sleep 60"], capture_output=True, text=True, timeout=30,
            cwd="/tmp", check=True).stdout.strip().split(";")[0]
        wait_until("robust's job running", lambda: (x := slurm.job(job)) and x.running, 60)

        # The root prolog moved the squatter aside and made robust's spool. slurmctld
        # says RUNNING as soon as the job is launched, while the node's prolog may still
        # run (the batch script starts only after it): wait for its result, not the state.
        # Between moving the squatter aside and making the new spool the name is absent.
        def made() -> tuple[int, int, int] | None:
            try:
                st = own.stat()
            except FileNotFoundError:
                return None
            got = (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
            return got if got == (robust.pw_uid, slurm_gid, 0o2770) else None

        try:
            wait_until("the prolog to make robust's spool", made, 60)
        except AssertionError:
            if not own.exists():
                raise AssertionError("no spool for robust after 60 s") from None
            st = own.stat()
            raise AssertionError(f"spool after 60 s: uid {st.st_uid} gid {st.st_gid} "
                                 f"mode {oct(stat.S_IMODE(st.st_mode))}") from None
        squatted = [p for p in root.iterdir() if p.name.startswith(f".squatted.{cfg.user}.")]
        assert squatted and squatted[0].stat().st_uid == mallory.pw_uid

        tried = run_as(cfg.attacker, MALLORY, str(root), cfg.user)
        assert tried.stdout.split() == ["mkdir", "refused", "plant", "refused",
                                        "list", "refused"], tried.stdout + tried.stderr

        wrote = run_as(cfg.user, WRITE, str(root), cfg.user, job)
        assert wrote.returncode == 0, wrote.stderr
        slurm.cancel(job)
        # slurmctld runs EpilogSlurmctld as SlurmUser at the job's end: it must read the
        # verdict (then refuse it: node3 is not the job's node) -- not fail to open it.
        records = wait_until("EpilogSlurmctld's record for the job", lambda: [
            r for r in read_records(site.verdict_log).records if r.get("job_id") == job], 60)
        assert not [r for r in records if r.get("action") == "error"], records
        whys = [r.get("why", "") for r in records]
        assert any("not in job" in w and r.get("node") == "node3"
                   for w, r in zip(whys, records, strict=True)), records
        assert not any("cannot be opened" in w or "must be owned" in w for w in whys), records
        # ... and renamed it as read (SlurmUser's group may write in the spool).
        done = [p.name for p in own.iterdir()]
        assert any(n.startswith(f"{job}.") and n.endswith(".done") for n in done), done
    finally:
        if job:
            subprocess.run(["scancel", job], env=minicluster.env, capture_output=True)
        for p in root.iterdir():
            if p.name.startswith(f".squatted.{cfg.user}."):
                _rmtree(p)
        if saved.exists():
            _rmtree(own)
            saved.rename(own)


def _rmtree(path: Path) -> None:
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)
