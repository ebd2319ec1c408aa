"""The node ledger's database: schema and migrations, safety of its directory, hostile
input, retention."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.health import node_ledger
from slurm_robust.health.node_ledger import (
    LEDGER_VERSION,
    EventKind,
    LedgerConfig,
    LedgerUnavailable,
    NodeEvent,
    NodeLedger,
    encode_evidence,
    ledger_config,
)

NOW = 1_800_000_000.0
DAY = 86400.0


def ledger(tmp_path: Path, **kw: object) -> NodeLedger:
    return NodeLedger(LedgerConfig(dir=str(tmp_path / "ledger"), **kw), clock=lambda: NOW)


def blame(node: str, job: str, t: float = NOW, **kw: object) -> NodeEvent:
    return NodeEvent(node, EventKind.BLAME, "epilog_slurmctld", t, job, **kw)


def test_a_new_database_is_private_in_wal_mode_at_the_current_version(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    assert led.record([blame("n1", "100")]) == 1
    assert led.schema_version() == LEDGER_VERSION == 1
    assert os.stat(led.dir).st_mode & 0o777 == 0o700
    assert os.stat(led.path).st_mode & 0o777 == 0o600
    with sqlite3.connect(led.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        cols = [r[1] for r in db.execute("PRAGMA table_info(events)")]
    assert cols == ["id", "time", "node", "kind", "job_id", "source", "check_name", "evidence"]


def test_an_older_database_is_migrated_step_by_step(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    led = ledger(tmp_path)
    led.record([blame("n1", "100")])

    def v2(db: sqlite3.Connection) -> None:
        db.execute("ALTER TABLE events ADD COLUMN site TEXT NOT NULL DEFAULT 'here'")

    monkeypatch.setattr(node_ledger, "MIGRATIONS", (*node_ledger.MIGRATIONS, v2))
    monkeypatch.setattr(node_ledger, "LEDGER_VERSION", 2)
    assert [e.job_id for e in led.history("n1")] == ["100"]  # opening migrates
    assert led.schema_version() == 2
    with sqlite3.connect(led.path) as db:
        assert db.execute("SELECT site FROM events").fetchall() == [("here",)]


def test_a_database_newer_than_the_code_is_refused_untouched(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    led.record([blame("n1", "100")])
    with sqlite3.connect(led.path) as db:
        db.execute(f"PRAGMA user_version = {LEDGER_VERSION + 1}")
    with pytest.raises(LedgerUnavailable, match="newer than this slurm_robust"):
        led.record([blame("n1", "101")])
    with sqlite3.connect(led.path) as db:
        assert db.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 1


def test_a_directory_others_can_enter_is_refused(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    led.dir.mkdir(mode=0o755)
    led.dir.chmod(0o755)
    with pytest.raises(LedgerUnavailable, match="mode 0700"):
        led.record([blame("n1", "100")])
    assert not led.path.exists()


def test_a_symlinked_database_file_is_refused(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    led.dir.mkdir(mode=0o700)
    target = tmp_path / "elsewhere.db"
    target.write_bytes(b"")
    led.path.symlink_to(target)
    with pytest.raises(LedgerUnavailable):
        led.record([blame("n1", "100")])
    assert target.read_bytes() == b""


def test_hostile_text_is_bounded_and_stored_as_data(tmp_path: Path) -> None:
    led = ledger(tmp_path, evidence_max_bytes=512)
    check = "x'); DROP TABLE events; --\n\x1b[31m" + "c" * 500
    led.record([NodeEvent("n1", EventKind.BLAME, "s" * 500, NOW, "100", check,
                          {"reason": "r" * 10_000, "deep": [[[[[]]]]]})])
    (e,) = led.history("n1")
    assert e.check.startswith("x'); DROP TABLE events; -- [31m") and len(e.check) == 64
    assert len(e.source) == 64 and "\x1b" not in e.check
    assert e.evidence["truncated"] is True and e.evidence["bytes"] > 10_000
    assert len(encode_evidence({"reason": "r" * 10_000}, 512)) <= 512
    assert led.history("n1")  # the table is still there


@pytest.mark.parametrize("event", [
    NodeEvent("n1;rm -rf /", EventKind.BLAME, "x"),
    NodeEvent("../etc", EventKind.BLAME, "x"),
    NodeEvent("n1", EventKind.BLAME, "x", job_id="12; DROP"),
])
def test_a_bad_node_name_or_job_id_writes_nothing(tmp_path: Path, event: NodeEvent) -> None:
    led = ledger(tmp_path)
    led.record([blame("n2", "99")])
    with pytest.raises(UsageError):
        led.record([blame("n2", "100"), event])
    assert [e.job_id for e in led.history("n2")] == ["99"]


def test_evidence_that_json_cannot_encode_is_kept_as_text(tmp_path: Path) -> None:
    cyclic: dict[str, object] = {}
    cyclic["self"] = cyclic
    led = ledger(tmp_path)
    led.record([blame("n1", "100", evidence=cyclic), blame("n1", "101", evidence={1, 2})])
    assert [type(e.evidence) for e in led.history("n1")] == [dict, str]


def test_old_rows_are_dropped_but_pardons_are_kept(tmp_path: Path) -> None:
    led = ledger(tmp_path, retain_days=10)
    led.record([blame("n1", "1", NOW - 11 * DAY),
                NodeEvent("n1", EventKind.PARDON, "admin", NOW - 11 * DAY),
                blame("n1", "2", NOW - 9 * DAY)])
    assert [(e.kind, e.job_id) for e in led.history("n1")] == [
        (EventKind.PARDON, None), (EventKind.BLAME, "2")]


def test_counts_are_distinct_jobs_in_the_window_since_the_last_pardon(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    led.record([blame("n1", "1", NOW - 40 * DAY), blame("n1", "2", NOW - 20 * DAY),
                blame("n1", "3", NOW - 10 * DAY), blame("n1", "3", NOW - 9 * DAY),
                NodeEvent("n1", EventKind.DEEP_CHECK_FAILED, "health_check", NOW - DAY),
                blame("n2", "4", NOW - DAY)])
    counts = led.counts_since(NOW - 30 * DAY)
    assert counts["n1"]["blaming_jobs"] == 2 and counts["n1"]["deep_failures"] == 1
    assert counts["n1"]["first_seen"] == NOW - 40 * DAY
    assert led.blaming_jobs("n1", NOW - 30 * DAY) == ["2", "3"]
    led.record([NodeEvent("n1", EventKind.PARDON, "admin", NOW - 5 * DAY)])
    assert led.counts_since(NOW - 30 * DAY)["n1"]["blaming_jobs"] == 0
    assert led.blaming_jobs("n1", NOW - 30 * DAY) == []


def test_reading_before_anything_was_recorded_says_so(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    led.dir.mkdir(mode=0o700)
    with pytest.raises(LedgerUnavailable, match="nothing recorded"):
        led.history("n1")


def test_a_held_write_lock_fails_within_the_busy_timeout(tmp_path: Path) -> None:
    import time

    led = ledger(tmp_path, busy_timeout_s=0.2)
    led.record([blame("n1", "1")])
    holder = sqlite3.connect(led.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        t0 = time.monotonic()
        with pytest.raises(LedgerUnavailable, match="locked"):
            led.record([blame("n1", "2")])
        assert time.monotonic() - t0 < 2.0
        assert [e.job_id for e in led.history("n1")] == ["1"]  # WAL: readers go on
    finally:
        holder.execute("ROLLBACK")
        holder.close()


@pytest.mark.parametrize(("raw", "match"), [
    ({"lemon_blames": 0}, "lemon_blames"),
    ({"lemon_blames": True}, "lemon_blames"),
    ({"lemon_window_days": -1}, "lemon_window_days"),
    ({"dir": "relative"}, "absolute"),
    ({"lemons_file": "x.json"}, "absolute"),
    ({"enabled": "yes"}, "enabled"),
    ({"lemon_blame": 3}, "unknown key"),
    ("on", "must be an object"),
])
def test_config_errors_name_the_key(raw: object, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        ledger_config(raw)


def test_config_defaults() -> None:
    cfg = ledger_config({})
    assert (cfg.lemon_blames, cfg.lemon_window_days, cfg.lemon_deep_failures) == (3, 30.0, 2)
    assert cfg.lemons_path == Path("/var/lib/slurm_robust/lemons.json")


def test_in_a_setgid_directory_root_and_slurmuser_share_the_database() -> None:
    """The reserve's log directory is root:SlurmUser, mode 2775: a ledger made there is
    2770 and its file 0660, so EpilogSlurmctld (SlurmUser, here uid nobody in its own
    group) records into the database root created, and root reads its rows."""
    import shutil
    import subprocess
    import sys
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    import pwd

    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        base.chmod(0o755)
        logdir = base / "log"
        logdir.mkdir()
        os.chown(logdir, 0, nobody.pw_gid)
        logdir.chmod(0o2775)
        led = NodeLedger(LedgerConfig(dir=str(logdir / "ledger")))
        led.record([NodeEvent("n1", EventKind.DRAIN, "prolog")])
        assert os.stat(led.dir).st_mode & 0o7777 == 0o2770
        assert os.stat(led.path).st_mode & 0o777 == 0o660
        code = (
            "import os, sys\n"
            f"os.setgid({nobody.pw_gid}); os.setuid({nobody.pw_uid})\n"
            "from slurm_robust.health.node_ledger import *\n"
            f"NodeLedger(LedgerConfig(dir={str(led.dir)!r})).record("
            "[NodeEvent('n1', EventKind.BLAME, 'epilog_slurmctld', job_id='7')])\n")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert [(e.kind, e.job_id) for e in led.history("n1")] == [
            (EventKind.DRAIN, None), (EventKind.BLAME, "7")]
    finally:
        shutil.rmtree(base)
