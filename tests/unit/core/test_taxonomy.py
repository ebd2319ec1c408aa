"""The taxonomy table, and how the post-mortem reads classes through it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from slurm_robust import records as rec
from slurm_robust.analysis.loaders import events_from_records
from slurm_robust.analysis.pipeline import analyse, load_inputs
from slurm_robust.analysis.taxonomy import CLASSES, read_class
from slurm_robust.simulate.paper import TABLE1_SHARES as PAPER_SHARES
from slurm_robust.taxonomy import (
    LEGACY,
    ROWS,
    TABLE,
    TABLE1_CLASSES,
    Action,
    Category,
    FailureClass,
    Side,
    canonical,
    evicts,
    stops_on_repeat,
)
from slurm_robust_rehearsal.synth.runs import Fault, synth_run, write_run_dir

TABLE1 = {"CUDA error": "cuda_error", "CPU overload": "cpu_overload", "CPU OOM": "cpu_oom",
          "Disk full": "disk_full", "Disk fault": "disk_fault",
          "Infiniband/network": "network", "File-system mount": "filesystem_mount",
          "Remote storage": "remote_storage", "Container/runtime": "container_runtime",
          "External service": "external_service", "Kernel panic": "kernel_panic",
          "GPU memory error": "gpu_memory_error", "GPU unavailable": "gpu_unavailable",
          "Job hang": "job_hang", "MFU decline": "mfu_decline", "NaN value": "nan",
          "Code/data change": "code_data_change"}
USER_CLASSES = {"user_exception", "user_cuda_fault", "gpu_oom", "bad_config"}
OURS = {"node_lost", "worker_signal"}


def test_table_has_every_class_once_with_enum_fields():
    names = [row.cls.value for row in TABLE]
    assert len(names) == len(set(names)) == len(FailureClass)
    assert {r.table1: r.cls.value for r in TABLE if r.table1} == TABLE1
    assert set(TABLE1.values()) | USER_CLASSES | OURS <= set(names)
    assert [c.value for c in TABLE1_CLASSES] == list(TABLE1.values())
    for row in TABLE:
        assert isinstance(row.category, Category) and isinstance(row.side, Side)
        assert isinstance(row.action, Action) and row.meaning
    assert set(CLASSES) == set(names)


def test_user_classes_are_user_side_and_never_evict():
    for name in USER_CLASSES:
        assert ROWS[FailureClass(name)].side is Side.USER
        assert stops_on_repeat(name) and not evicts(name)
    for row in TABLE:
        if row.action is Action.EVICT:
            assert row.side is Side.INFRASTRUCTURE, row


def test_table1_categories():
    implicit = {"job_hang", "mfu_decline", "nan"}
    for name in TABLE1.values():
        cat = ROWS[FailureClass(name)].category
        expected = (Category.IMPLICIT if name in implicit else
                    Category.MANUAL if name == "code_data_change" else Category.EXPLICIT)
        assert cat is expected, name


def test_legacy_names_map_to_their_class_and_unknown_is_none():
    assert canonical("disk_error") is FailureClass.DISK_FAULT
    assert canonical("user_code") is FailureClass.USER_EXCEPTION
    assert canonical("worker_crash") is FailureClass.WORKER_SIGNAL
    assert canonical("hang") is FailureClass.JOB_HANG
    assert all(canonical(old) is new for old, new in LEGACY.items())
    assert canonical("gremlins") is None


def test_read_class_refuses_unknown_and_contradicting_records():
    assert read_class("oom") == ("gpu_oom", "")
    assert read_class("nan", "implicit") == ("nan", "")
    cls, why = read_class("nan", "explicit")
    assert cls is None and "'implicit' in the taxonomy" in why
    cls, why = read_class("gremlins")
    assert cls is None and "unknown class 'gremlins'" in why


def _incident(i: int, cls: str, category: str) -> dict[str, object]:
    return rec.make_record(rec.EVENT_SCHEMA, 1, {
        "run_id": "r", "job_id": "1", "attempt": 0, "event": "incident", "incident": f"i{i}",
        "category": category, "class": cls, "detected_at": 10.0 + i, "rung": "in_place",
        "nodes": [], "ranks": [], "steps_lost": 0, "evidence": {}}, now=10.0 + i)


def test_report_counts_unknown_and_contradicting_classes_as_unread():
    records = [_incident(0, "gpu_unavailable", "explicit"), _incident(1, "worker_crash",
               "explicit"), _incident(2, "gremlins", "explicit"), _incident(3, "nan",
               "explicit")]
    log = events_from_records(records, source="t")
    assert sorted(log.incidents["class"].astype(str)) == ["gpu_unavailable", "worker_signal"]
    assert log.issues.invalid_records == {"t: incident class": 2}
    assert any("unknown class 'gremlins'" in e for e in log.issues.examples)
    assert any("'nan' is 'implicit'" in e for e in log.issues.examples)


# Table 1's published shares (slurm_robust.simulate.paper, in the paper's row order, which
# is also TABLE1's order), renormalised over the 17 rows.
assert len(PAPER_SHARES) == len(TABLE1)
SHARES = {cls: share / sum(PAPER_SHARES.values())
          for cls, share in zip(TABLE1.values(), PAPER_SHARES.values(), strict=True)}


def test_synthetic_trace_comes_back_through_the_report_within_half_a_point(tmp_path: Path):
    n = 400
    rng = np.random.default_rng(13)
    drawn = rng.choice(list(SHARES), size=n, p=list(SHARES.values()))
    faults = [Fault(i + 1, str(cls), "in_place") for i, cls in enumerate(drawn)]
    run = synth_run(steps=n + 1, step_time_s=1.0, faults=faults)
    write_run_dir(tmp_path / "run", run)
    an = analyse(load_inputs([tmp_path / "run"]))
    table = an.by_class.set_index("class")
    assert set(TABLE1.values()) <= set(table.index)  # every class, by its own name
    for cls in TABLE1.values():
        assert table.loc[cls, "category"] == ROWS[FailureClass(cls)].category.value
        drawn_share = float((drawn == cls).mean())
        assert abs(100 * table.loc[cls, "share"] - 100 * drawn_share) <= 0.5, cls
        # and the draw itself is close to the shares it was drawn from
        assert abs(drawn_share - SHARES[cls]) <= 0.05, cls
    assert an.issues.total == 0


def test_taxonomy_doc_prints_the_same_table():
    doc = (Path(__file__).resolve().parents[3] / "docs" / "TAXONOMY.md").read_text()
    for row in TABLE:
        line = (f"| `{row.cls.value}` | {row.category.value} | {row.side.value} | "
                f"{row.action.value} | {row.table1 or '-'} | {row.meaning} | "
                f"{row.locus.value} |")
        assert line in doc, line
