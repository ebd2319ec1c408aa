"""Code and package changes made outside `slurm-robust update` between allocations
(classification): the fingerprint, and a new controller passing `code_change` to the agents."""

from __future__ import annotations

import sys
from pathlib import Path

from slurm_robust.launcher.classify import Evidence, classify
from slurm_robust.launcher.control import env_change
from slurm_robust.launcher.control.state import load_state
from slurm_robust.launcher.enums import Phase
from slurm_robust.launcher.paths import RunPaths
from tests.unit.launcher.control.test_hot_update import CodeHarness


def test_fingerprint_names_the_script_that_changed(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    (tmp_path / "data").mkdir()
    cmd = [sys.executable, "train.py", "--steps", "5", "data", "--lr=0.1"]
    old = env_change.take(cmd, tmp_path)
    assert list(old.files) == ["train.py"] and old.files["train.py"].startswith("sha256:")
    assert old.packages is not None and "distributions" in old.packages_basis
    assert env_change.changes(None, old) == []  # nothing to compare with: no change
    assert env_change.changes(old, env_change.take(cmd, tmp_path)) == []
    script.write_text("print(2)\n")
    new = env_change.take(cmd, tmp_path)
    assert env_change.changes(old, new) == ["train.py changed"]
    stored = env_change.Fingerprint.from_dict(old.to_dict())
    assert stored == old
    assert env_change.Fingerprint.from_dict({"v": 99, "files": {}}) is None
    assert env_change.changes(stored, new) == ["train.py changed"]


def test_another_interpreters_packages_are_not_guessed(tmp_path):
    fp = env_change.take(["/nonexistent/python3", "x.py"], tmp_path)
    assert fp.packages is None and "not the launcher's" in fp.packages_basis
    other = env_change.Fingerprint(packages="a")
    assert env_change.changes(other, fp) == []  # unknown is not a change


def test_packages_that_changed_are_a_change():
    old = env_change.Fingerprint(packages="a")
    assert env_change.changes(old, env_change.Fingerprint(packages="b")) == \
        ["installed packages changed"]


def test_window_is_counted_from_the_step_reached():
    change = {"step": 30, "what": ["train.py changed"]}
    assert env_change.recent(change, None) and env_change.recent(change, 30)
    assert env_change.recent(change, 30 + env_change.WINDOW_STEPS - 1)
    assert not env_change.recent(change, 30 + env_change.WINDOW_STEPS)


def _first_allocation(tmp_path: Path) -> CodeHarness:
    h = CodeHarness(tmp_path)
    h.start()
    h.rec.persist()
    st = load_state(RunPaths.of(h.cfg.run_dir).state)
    assert st.fingerprint is not None and st.env_change is None
    assert not h.rec.plan_for(0).code_change
    return h


def test_an_edited_script_between_allocations_is_a_recorded_change(tmp_path):
    first = _first_allocation(tmp_path)
    (first.v0 / "train.py").write_text("print('edited between allocations')\n")
    h = CodeHarness(tmp_path, run_dir=Path(first.cfg.run_dir))  # the requeued allocation
    h.tick()
    st = h.rec.state
    assert st.env_change is not None
    assert st.env_change["what"] == [f"{first.v0 / 'train.py'} changed"]
    assert st.env_change["step"] == 3
    assert h.rec.plan_for(0).code_change and h.rec.plan_for(1).code_change
    # The agents classify a user error under such a plan as the change's, never a node's.
    tail = "Traceback (most recent call last):\nKeyError: 'angle_means'\n"
    c = classify(Evidence(exit_code=1, log_tail=tail, change_recorded=True))
    assert (c.cls, c.side, c.evicts) == ("code_data_change", "user", False)
    # ... and the incident names the change it was counted against.
    assert h.rec.phase is Phase.RUNNING, h.rec.phase
    h.restored(3)
    h.fail(h.members[0], "code_data_change", category="manual",
           signature="code_data_change:KeyError@train.py:1")
    h.settle()
    h.restored(3)
    h.step = 3
    h.steps(1)  # the incident is written once the run steps again
    inc = h.incidents()[-1]
    assert inc["class"] == "code_data_change"
    assert inc["evidence"]["env_change"] == {"step": 3, "attempt": st.env_change["attempt"],
                                             "what": [f"{first.v0 / 'train.py'} changed"]}


def test_an_unchanged_script_is_no_change(tmp_path):
    first = _first_allocation(tmp_path)
    h = CodeHarness(tmp_path, run_dir=Path(first.cfg.run_dir))
    h.tick()
    assert h.rec.state.env_change is None and not h.rec.plan_for(0).code_change


def test_a_fifo_swapped_in_for_a_file_does_not_block_the_controller(tmp_path):
    # The controller fingerprints under its lock; a path in a directory others can write
    # may turn into a FIFO between the is_file check and the open.
    import os
    import threading

    fifo = tmp_path / "manifest.json"
    os.mkfifo(fifo)
    outcome: list[object] = []

    def digest() -> None:
        try:
            outcome.append(env_change._file_digest(fifo))
        except OSError as exc:
            outcome.append(exc)

    t = threading.Thread(target=digest, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "the digest blocked on a FIFO"
    assert isinstance(outcome[0], OSError) and "not a regular file" in str(outcome[0])
