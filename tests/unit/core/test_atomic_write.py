"""Atomic writes cannot be redirected or blocked by names planted in their directory.

In a directory others can write to (a 1777 state directory, /tmp), a temp name that can
be predicted lets another user plant a symlink there (the write lands in a file of their
choosing) or a FIFO (the open blocks forever). The predictable names below are the ones
the helpers used before: the pid-based name next to the target.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from ckpt.blob import write_file_atomic
from slurm_robust.records import append_record, write_bytes_atomic, write_json_atomic


def _predictable(path: Path) -> list[Path]:
    pid = os.getpid()
    return [path.with_name(f".{path.name}.{pid}.tmp"), path.with_name(f".{path.name}.tmp"),
            path.with_suffix(f".tmp{pid}"), path.with_suffix(".tmp")]


def _ends(fn, timeout_s: float = 5.0) -> bool:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(timeout_s)
    return not t.is_alive()


@pytest.mark.parametrize("write", [
    lambda p: write_json_atomic(p, {"seq": 7}),
    lambda p: write_file_atomic(p, [b'{"seq": 7}'], durable=True),
])
def test_a_symlink_planted_at_a_predictable_temp_name_is_not_followed(tmp_path, write):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = shared / "xid_cursor.json"
    for name in _predictable(target):
        name.symlink_to(victim)
    write(target)
    assert victim.read_text() == "precious"
    assert json.loads(target.read_text()) == {"seq": 7}


@pytest.mark.parametrize("write", [
    lambda p: write_json_atomic(p, {"seq": 7}),
    lambda p: write_file_atomic(p, [b'{"seq": 7}'], durable=True),
])
def test_a_fifo_planted_at_a_predictable_temp_name_does_not_block(tmp_path, write):
    target = tmp_path / "state.json"
    for name in _predictable(target):
        os.mkfifo(name)
    try:
        assert _ends(lambda: write(target)), "the write blocked on a planted FIFO"
        assert json.loads(target.read_text()) == {"seq": 7}
    finally:
        for name in _predictable(target):  # unblock a writer stuck in open()
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK)
                os.close(fd)
            except OSError:
                pass


def test_a_symlink_at_the_target_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = tmp_path / "state.json"
    target.symlink_to(victim)
    write_json_atomic(target, {"ok": True})
    assert victim.read_text() == "precious" and not target.is_symlink()


def test_a_failed_write_leaves_no_temp_file(tmp_path):
    def chunks():
        yield b"half"
        raise RuntimeError("writer died")
    with pytest.raises(RuntimeError):
        write_bytes_atomic(tmp_path / "x.json", chunks())
    assert list(tmp_path.iterdir()) == []


def test_appends_refuse_a_symlink_at_the_journal(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("")
    journal = tmp_path / "events.jsonl"
    journal.symlink_to(victim)
    with pytest.raises(OSError):
        append_record(journal, {"schema": "x", "v": 1, "time": 0.0})
    assert victim.read_text() == ""
