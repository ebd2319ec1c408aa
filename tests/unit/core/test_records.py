"""JSON-lines records: concurrent appends never tear, readers count what they cannot read."""

import json
import multiprocessing as mp

import pytest

from slurm_robust.records import (
    HEALTH_SCHEMA,
    RecordError,
    append_record,
    append_records,
    make_record,
    read_records,
    write_json_atomic,
)


def _writer(path: str, worker: int, n: int) -> None:
    for i in range(n):
        append_record(path, make_record(HEALTH_SCHEMA, 1, {"w": worker, "i": i,
                                                             "pad": "x" * 3000}))


def test_concurrent_appends_from_processes_never_interleave(tmp_path):
    path = tmp_path / "journal.jsonl"
    procs = [mp.get_context("fork").Process(target=_writer, args=(str(path), w, 200))
             for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    result = read_records(path)
    assert result.malformed == 0
    assert len(result.records) == 800
    seen = {(r["w"], r["i"]) for r in result.records}
    assert len(seen) == 800


def test_malformed_and_torn_lines_are_counted_not_fatal(tmp_path):
    path = tmp_path / "j.jsonl"
    append_records(path, [make_record("a", 1, {"k": 1}), make_record("b", 1, {"k": 2})])
    with open(path, "ab") as fh:
        fh.write(b"not json\n[1,2]\n{\"no_schema\": 1}\n{\"schema\": \"a\", \"v\": 1, \"ti")
    result = read_records(path, schema="a")
    assert [r["k"] for r in result.records] == [1]
    assert result.malformed == 4
    assert result.malformed_examples[0].endswith(":3")


def test_missing_file_reads_as_empty(tmp_path):
    assert read_records(tmp_path / "none.jsonl").records == []


def test_non_finite_and_unserialisable_values_are_refused(tmp_path):
    with pytest.raises(RecordError):
        append_record(tmp_path / "x", make_record("a", 1, {"loss": float("nan")}))
    with pytest.raises(RecordError):
        append_record(tmp_path / "x", make_record("a", 1, {"obj": object()}))
    assert not (tmp_path / "x").exists()


def test_header_comes_first_and_time_is_set():
    rec = make_record("kind", 3, {"a": 1}, now=12.5)
    assert list(rec)[:3] == ["schema", "v", "time"] and rec["time"] == 12.5


def test_atomic_json_write_replaces_whole_file(tmp_path):
    path = tmp_path / "state.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"b": 2})
    assert json.loads(path.read_text()) == {"b": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
