"""The lemon rule, the published lemons file, and recording that never fails a caller."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from slurm_robust.health import ledger_writer
from slurm_robust.health.ledger_writer import SiteLedger, current_lemons, record_safely
from slurm_robust.health.lemons import lemons, publish, read_published, score, scores
from slurm_robust.health.node_ledger import EventKind, LedgerConfig, NodeEvent, NodeLedger
from slurm_robust.site_config import SiteConfig

NOW = 1_800_000_000.0
DAY = 86400.0


def cfg_in(tmp_path: Path, **kw: object) -> LedgerConfig:
    return LedgerConfig(dir=str(tmp_path / "ledger"), lemons_file=str(tmp_path / "lemons.json"),
                        **kw)


def site_in(tmp_path: Path, **kw: object) -> SiteConfig:
    return SiteConfig(ledger={"dir": str(tmp_path / "ledger"),
                              "lemons_file": str(tmp_path / "lemons.json"), **kw})


def blame(node: str, job: str, days_ago: float = 1.0) -> NodeEvent:
    return NodeEvent(node, EventKind.BLAME, "epilog_slurmctld", NOW - days_ago * DAY, job)


def test_three_distinct_jobs_in_30_days_make_a_lemon_by_default(tmp_path: Path) -> None:
    led = NodeLedger(cfg_in(tmp_path))
    led.record([blame("n1", "1", 29), blame("n1", "2", 10), blame("n1", "3", 1),
                blame("n2", "1", 1), blame("n2", "2", 1)])
    assert lemons(led, NOW) == ["n1"]
    (s1, s2) = scores(led, NOW)
    assert (s1.node, s1.lemon, s1.blaming_jobs) == ("n1", True, 3)
    assert "blamed by 3 distinct jobs in 30 days (threshold 3)" in s1.why
    assert (s2.node, s2.lemon, s2.why) == ("n2", False, "")


def test_one_job_blaming_a_node_again_and_again_is_one_suspicion(tmp_path: Path) -> None:
    led = NodeLedger(cfg_in(tmp_path))
    led.record([blame("n1", "7", d) for d in (1, 2, 3, 4, 5)])
    assert lemons(led, NOW) == []


def test_blames_older_than_the_window_do_not_count(tmp_path: Path) -> None:
    led = NodeLedger(cfg_in(tmp_path))
    led.record([blame("n1", "1", 31), blame("n1", "2", 10), blame("n1", "3", 1)])
    assert lemons(led, NOW) == []
    led2 = NodeLedger(cfg_in(tmp_path / "b", lemon_window_days=45.0))
    led2.record([blame("n1", "1", 31), blame("n1", "2", 10), blame("n1", "3", 1)])
    assert lemons(led2, NOW) == ["n1"]


def test_failed_deep_checks_make_a_lemon_and_a_pardon_clears_it(tmp_path: Path) -> None:
    led = NodeLedger(cfg_in(tmp_path))
    fail = [NodeEvent("n3", EventKind.DEEP_CHECK_FAILED, "health_check", NOW - d * DAY)
            for d in (3, 2)]
    led.record(fail)
    assert lemons(led, NOW) == ["n3"]
    led.record([NodeEvent("n3", EventKind.PARDON, "admin", NOW - 1 * DAY)])
    assert lemons(led, NOW) == []


def test_the_rate_uses_time_in_service_within_the_window() -> None:
    cfg = LedgerConfig()
    young = score("n1", {"blaming_jobs": 3, "first_seen": NOW - 3 * DAY}, cfg, NOW)
    old = score("n1", {"blaming_jobs": 3, "first_seen": NOW - 300 * DAY}, cfg, NOW)
    assert (young.service_days, young.blames_per_30d) == (3.0, 30.0)
    assert (old.service_days, old.blames_per_30d) == (30.0, 3.0)
    assert young.lemon and old.lemon


def test_published_file_round_trips_and_rejects_what_is_not_a_node_name(
        tmp_path: Path) -> None:
    path = tmp_path / "lemons.json"
    assert publish(path, ["n2", "n1", "n2"], NOW) is True
    assert publish(path, ["n1", "n2"], NOW) is False  # unchanged: not rewritten
    assert read_published(path) == ["n1", "n2"]
    assert path.stat().st_mode & 0o777 == 0o644
    path.write_text(json.dumps({"schema": "slurm_robust.lemons", "lemons": ["n1 --uid=0"]}))
    with pytest.raises(ValueError, match="not a valid node name"):
        read_published(path)
    path.write_text(json.dumps({"lemons": ["n1"]}))
    with pytest.raises(ValueError, match="not a slurm_robust.lemons file"):
        read_published(path)


def test_record_safely_writes_and_publishes_the_lemons(tmp_path: Path) -> None:
    site = site_in(tmp_path)
    assert record_safely([blame("n1", str(j)) for j in (1, 2, 3)], site)
    assert read_published(tmp_path / "lemons.json") == ["n1"]


def test_record_safely_never_raises_on_a_locked_database(tmp_path: Path) -> None:
    site = site_in(tmp_path, busy_timeout_s=0.1)
    assert record_safely([blame("n1", "1")], site)
    holder = sqlite3.connect(tmp_path / "ledger" / "nodes.sqlite3", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    warnings: list[str] = []
    try:
        assert record_safely([blame("n1", "2")], site, warn=warnings.append) is False
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert len(warnings) == 1 and "locked" in warnings[0] and "n1" in warnings[0]


def test_record_safely_never_raises_on_a_bad_config_or_an_unexpected_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    warnings: list[str] = []
    bad = SiteConfig(ledger={"lemon_blames": 0})
    assert record_safely([blame("n1", "1")], bad, warn=warnings.append) is False
    assert "lemon_blames" in warnings[-1]

    def boom(self: NodeLedger, events: object) -> int:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(NodeLedger, "record", boom)
    assert record_safely([blame("n1", "1")], site_in(tmp_path), warn=warnings.append) is False
    assert "RuntimeError: disk on fire" in warnings[-1]


def test_a_disabled_ledger_records_nothing_and_knows_no_lemons(tmp_path: Path) -> None:
    site = site_in(tmp_path, enabled=False)
    assert record_safely([blame("n1", "1")], site) is False
    assert not (tmp_path / "ledger").exists()
    assert current_lemons(site) == frozenset()


def test_current_lemons_falls_back_to_the_published_file(tmp_path: Path) -> None:
    site = site_in(tmp_path)
    record_safely([blame("n1", str(j)) for j in (1, 2, 3)], site)
    assert SiteLedger(site).lemons() == frozenset({"n1"})
    (tmp_path / "ledger").chmod(0o755)  # unsafe now: the database is not read
    warnings: list[str] = []
    assert current_lemons(site, warn=warnings.append) == frozenset({"n1"})
    assert "published lemons" in warnings[0]
    (tmp_path / "lemons.json").unlink()
    assert current_lemons(site, warn=warnings.append) == frozenset()


def test_no_ledger_yet_means_no_lemons_without_a_warning(tmp_path: Path) -> None:
    warnings: list[str] = []
    assert current_lemons(site_in(tmp_path), warn=warnings.append) == frozenset()
    assert warnings == []


def test_the_writer_reads_the_site_config_file_by_default(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "site.json"
    conf.write_text(json.dumps({"ledger": {"dir": str(tmp_path / "l2")}}))
    monkeypatch.setenv("SLURM_ROBUST_CONFIG", str(conf))
    assert ledger_writer.site_ledger_config().dir == str(tmp_path / "l2")


def test_a_lemons_file_that_cannot_be_written_still_records_the_events(
        tmp_path: Path) -> None:
    site = SiteConfig(ledger={"dir": str(tmp_path / "ledger"),
                              "lemons_file": str(tmp_path / "no" / "such" / "lemons.json")})
    (tmp_path / "no").write_text("a file where a directory should be")
    warnings: list[str] = []
    assert record_safely([blame("n1", "1")], site, warn=warnings.append) is True
    assert "recorded, but the lemons file" in warnings[0]
    assert len(NodeLedger(cfg_in(tmp_path)).history("n1")) == 1
