"""Reading job verdicts as the privileged side: hostile files are refused, never followed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.reserve.verdicts import (
    ensure_user_spool,
    ensure_verdict_root,
    parse_verdict_file,
    parse_verdicts,
    read_job_verdicts,
    verdict_path,
    write_restart_request,
    write_verdict,
)

NODES = ("node1", "node2")
UID = os.geteuid()
USER = "alice"


def line(**fields: object) -> bytes:
    rec = {"schema": "slurm_robust.verdict", "v": 1, "time": 1.0, "job_id": "42",
           "node": "node2", "reason": "gpu_xid: Xid 79", "class": "gpu_memory_error",
           "evidence": {"xid": 79}, "incident": "i1"}
    rec.update(fields)
    return (json.dumps(rec) + "\n").encode()


def test_parse_accepts_only_this_jobs_nodes() -> None:
    data = line() + line(node="node9") + line(job_id="43") + b"{not json\n" + line(node="node1")
    verdicts, refusals = parse_verdicts(data, "42", NODES, 64)
    assert [v.node for v in verdicts] == ["node2", "node1"]
    whys = " | ".join(r.why for r in refusals)
    assert "'node9' is not in job 42's allocation" in whys
    assert "job_id '43'" in whys and "not JSON" in whys
    assert [r.node for r in refusals if "allocation" in r.why] == ["node9"]


def test_parse_cleans_reason_dedupes_and_caps() -> None:
    data = line(reason="bad\nState=resume x") + line() + line(node="node1")
    verdicts, refusals = parse_verdicts(data, "42", NODES, 1)
    assert verdicts[0].reason == "bad State=resume x"  # one line, no injected newline
    assert len(verdicts) == 1 and "over the limit" in refusals[0].why


def test_write_then_read_round_trip_and_file_is_consumed(tmp_path: Path) -> None:
    root = tmp_path / "verdicts"
    ensure_verdict_root(root)
    assert oct(root.stat().st_mode & 0o7777) == "0o755"
    run_dir = tmp_path / "run"
    path = write_verdict(root, USER, "42", "node2", "gpu_xid: Xid 79", "gpu_memory_error",
                         {"xid": 79}, "i1", run_dir=run_dir)
    assert path == verdict_path(root, USER, "42")
    assert (run_dir / "verdicts.jsonl").exists()
    batch = read_job_verdicts(root, USER, UID, "42", NODES, 4096, 64, restart_count=0)
    assert batch is not None and [v.node for v in batch.verdicts] == ["node2"]
    # Consumed: the next end of the same job does not apply it again.
    assert read_job_verdicts(root, USER, UID, "42", NODES, 4096, 64) is None
    assert (root / USER / "42.0.done").exists()


def test_no_file_is_the_fast_path(tmp_path: Path) -> None:
    assert read_job_verdicts(tmp_path, USER, UID, "42", NODES, 4096, 64) is None
    (tmp_path / USER).mkdir(mode=0o700)
    assert read_job_verdicts(tmp_path, USER, UID, "42", NODES, 4096, 64) is None


def make_user_dir(root: Path) -> Path:
    d = root / USER
    d.mkdir(mode=0o700)
    return d


def test_symlinked_file_is_refused_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret.jsonl"
    secret.write_bytes(line())
    d = make_user_dir(tmp_path)
    (d / "42.jsonl").symlink_to(secret)
    batch = read_job_verdicts(tmp_path, USER, UID, "42", NODES, 4096, 64)
    assert batch is not None and batch.verdicts == [] and "opened safely" in batch.refusals[0].why


def test_symlinked_user_dir_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    (real / "42.jsonl").write_bytes(line())
    (tmp_path / USER).symlink_to(real)
    batch = read_job_verdicts(tmp_path, USER, UID, "42", NODES, 4096, 64)
    assert batch is not None and batch.verdicts == [] and "not a directory" in batch.refusals[0].why


def test_fifo_does_not_block(tmp_path: Path) -> None:
    d = make_user_dir(tmp_path)
    os.mkfifo(d / "42.jsonl")
    batch = read_job_verdicts(tmp_path, USER, UID, "42", NODES, 4096, 64)
    assert batch is not None and "not a regular file" in batch.refusals[0].why


def test_oversized_file_is_refused_unread(tmp_path: Path) -> None:
    d = make_user_dir(tmp_path)
    (d / "42.jsonl").write_bytes(line() * 100)
    batch = read_job_verdicts(tmp_path, USER, UID, "42", NODES, 512, 64)
    assert batch is not None and batch.verdicts == [] and "byte limit" in batch.refusals[0].why


def test_file_of_another_owner_is_refused(tmp_path: Path) -> None:
    d = make_user_dir(tmp_path)
    (d / "42.jsonl").write_bytes(line())
    batch = read_job_verdicts(tmp_path, USER, UID + 1, "42", NODES, 4096, 64)
    assert batch is not None and batch.verdicts == [] and "owned by uid" in batch.refusals[0].why


def test_world_writable_user_dir_is_refused(tmp_path: Path) -> None:
    d = make_user_dir(tmp_path)
    (d / "42.jsonl").write_bytes(line())
    os.chmod(d, 0o707)
    batch = read_job_verdicts(tmp_path, USER, UID, "42", NODES, 4096, 64)
    assert batch is not None and batch.verdicts == [] and "writable only" in batch.refusals[0].why


def test_hard_link_is_refused(tmp_path: Path) -> None:
    d = make_user_dir(tmp_path)
    other = tmp_path / "other.jsonl"
    other.write_bytes(line())
    os.link(other, d / "42.jsonl")
    batch = read_job_verdicts(tmp_path, USER, UID, "42", NODES, 4096, 64)
    assert batch is not None and "hard links" in batch.refusals[0].why


@pytest.mark.parametrize(("user", "job"), [("../etc", "42"), ("alice", "42/../x"),
                                           ("", "42"), ("alice", "")])
def test_path_components_are_validated(tmp_path: Path, user: str, job: str) -> None:
    with pytest.raises(UsageError):
        verdict_path(tmp_path, user, job)


def test_a_verdict_nested_200000_levels_is_refused_cleanly() -> None:
    deep = b'{"schema": "slurm_robust.verdict", "evidence": ' + b"[" * 200_000 + b"]" * 200_000
    data = deep + b"}\n" + line()
    verdicts, refusals = parse_verdicts(data, "42", NODES, 64)
    assert [v.node for v in verdicts] == ["node2"]
    assert "nested too deep" in refusals[0].why


def test_deep_or_large_evidence_is_dropped_not_carried() -> None:
    nested: dict = {"x": 1}
    for _ in range(50):
        nested = {"n": nested}
    verdicts, _ = parse_verdicts(line(evidence=nested) + line(node="node1",
                                                             evidence={"xs": list(range(999))}),
                                 "42", NODES, 64)
    assert [v.evidence for v in verdicts] == [{}, {}]


def test_fuzzed_verdict_files_never_raise() -> None:
    import random

    rng = random.Random(7)
    base = line() + line(node="node1", evidence={"a": [1, {"b": 2}]}) + line(job_id="9")
    for _ in range(500):
        buf = bytearray(base)
        for _ in range(rng.randint(1, 8)):
            op = rng.random()
            i = rng.randrange(len(buf) + 1)
            if op < 0.4 and buf:
                buf[min(i, len(buf) - 1)] = rng.randrange(256)
            elif op < 0.6:
                del buf[i:i + rng.randint(1, 20)]
            elif op < 0.8:
                buf[i:i] = rng.choice([b"[" * 5000, b"{", b"\n", b"\xff\xfe", b'"node":"node2"'])
            else:
                buf[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 10)))
        verdicts, refusals = parse_verdicts(bytes(buf), "42", NODES, 64)
        assert all(v.node in NODES and v.job_id == "42" for v in verdicts)
        assert all(isinstance(r.why, str) for r in refusals)


def test_user_spool_is_made_for_its_owner_and_a_squatted_one_is_moved_aside(
        tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("ensure_user_spool chowns: root only")
    root = tmp_path / "verdicts"
    ensure_verdict_root(root, gid=4242)
    assert (root.stat().st_uid, root.stat().st_gid) == (0, 4242)
    assert ensure_user_spool(root, "alice", 4321) == "created"
    st = (root / "alice").stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (4321, 4242, 0o2770)
    assert ensure_user_spool(root, "alice", 4321) == "ok"
    # Another user's directory under alice's name (an older, world-writable spool).
    os.mkdir(root / "bob")
    os.chown(root / "bob", 9999, 9999)
    assert ensure_user_spool(root, "bob", 4322) == "replaced"
    assert (root / "bob").stat().st_uid == 4322
    assert [p.name for p in root.iterdir() if p.name.startswith(".squatted.bob.")]
    # A link in the user's place is moved aside, never followed.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "carol").symlink_to(elsewhere)
    assert ensure_user_spool(root, "carol", 4323) == "replaced"
    assert elsewhere.stat().st_uid == 0 and (root / "carol").is_dir()


def test_group_writable_user_dir_is_read_only_with_the_spool_group(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another group: root only")
    d = make_user_dir(tmp_path)
    (d / "42.jsonl").write_bytes(line())
    os.chmod(d, 0o770)
    os.chown(d, UID, tmp_path.stat().st_gid + 1)  # a group that is not the spool's
    batch = read_job_verdicts(tmp_path, USER, UID, "42", NODES, 4096, 64)
    assert batch is not None and batch.verdicts == [] and "writable only" in batch.refusals[0].why
    os.chown(d, UID, tmp_path.stat().st_gid)
    batch = read_job_verdicts(tmp_path, USER, UID, "42", NODES, 4096, 64)
    assert batch is not None and [v.node for v in batch.verdicts] == ["node2"]


def test_a_restart_request_is_neither_a_verdict_nor_a_refusal(tmp_path: Path) -> None:
    root = tmp_path / "verdicts"
    ensure_verdict_root(root)
    write_restart_request(root, USER, "42", "time\nlimit")
    write_verdict(root, USER, "42", "node2", "gpu_xid: Xid 79", "gpu_memory_error")
    rec = json.loads(verdict_path(root, USER, "42").read_text().splitlines()[0])
    assert (rec["schema"], rec["v"], rec["job_id"], rec["why"]) == (
        "slurm_robust.restart_request", 1, "42", "time limit")  # one line
    batch = read_job_verdicts(root, USER, UID, "42", NODES, 4096, 64)
    assert batch is not None and batch.restart_requested
    assert [v.node for v in batch.verdicts] == ["node2"] and batch.refusals == []


def test_a_restart_request_for_another_job_is_refused() -> None:
    other = json.dumps({"schema": "slurm_robust.restart_request", "v": 1, "job_id": "43",
                        "why": "x"}).encode() + b"\n"
    verdicts, refusals, restart = parse_verdict_file(other, "42", NODES, 64)
    assert not restart and verdicts == []
    assert "restart request for job_id '43', not this job (42)" in refusals[0].why
    # parse_verdicts (verdicts and refusals only) sees the same refusal.
    assert parse_verdicts(other, "42", NODES, 64)[1] == refusals
