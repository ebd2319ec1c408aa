"""Hot update and rollback on the real mini-cluster.

Each run is examples/train_gpt.py (the module's reference workload, see
test_launcher_faults.py) changed while it trains with the real CLI (`slurm-robust
update`). The new version is a copy of the example that prints a marker after its
restore and, through `--args`, trains on another data seed from the switch on (a data
change); the reference is a fault-free standalone run of a copy that switches the seed at
the same step. Equal params_sha256 means the switch lost and redid nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_robust.launcher import versions as vs
from slurm_robust.launcher.control.state import load_state
from tests.integration.cluster_helpers import standalone_digest, wait_until
from tests.integration.test_launcher_faults import (  # noqa: F401 - fixtures
    CLI,
    EXAMPLE,
    NODES,
    STEPS,
    TRAIN_ARGS,
    baseline_sha,
    runs,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED2 = 99
NEW_ARGS = " ".join([*TRAIN_ARGS, "--seed", str(SEED2)])
_BATCH_SEED = "g = torch.Generator().manual_seed(args.seed * 1_000_003"


#: The new version's bug, in its first step: a TypeError (a user exception), or quitting
#: with status 3 and no message (an exit no evidence names a cause for).
BUGS = {"typeerror": None, "silent_exit": "os._exit(3)"}


def new_version(tmp_path: Path, name: str, bug: str | None = None) -> Path:
    """A copy of the example that prints ``HOT-UPDATE-MARKER name start=N`` after its
    restore; ``bug``: a key of BUGS, the broken change."""
    src = EXAMPLE.read_text()
    anchor = "    start = run.restore(model, opt, sched)\n"
    assert src.count(anchor) == 1
    src = src.replace(anchor, anchor + f"    print(f'HOT-UPDATE-MARKER {name} start={{start}}'"
                                       ", flush=True)\n")
    if bug:
        guard = "if args.bug_at_step is not None and step + 1 == args.bug_at_step:"
        assert src.count(guard) == 1
        src = src.replace(guard, "if True:  # the new version's bug")
        if BUGS[bug] is not None:
            body = '_ = "step " + (step + 1)'
            assert src.count(body) == 1
            src = src.replace(body, BUGS[bug])
    d = tmp_path / name
    d.mkdir()
    (d / "train_gpt.py").write_text(src)
    return d


def reference_sha(tmp_path: Path, switch: int) -> str:
    """Fault-free standalone run that trains on seed SEED2's data from step ``switch``."""
    src = EXAMPLE.read_text()
    assert src.count(_BATCH_SEED) == 1
    src = src.replace(_BATCH_SEED, "g = torch.Generator().manual_seed("
                                   f"(args.seed if step < {switch} else {SEED2}) * 1_000_003")
    script = tmp_path / f"reference_{switch}.py"
    script.write_text(src)
    return standalone_digest([sys.executable, str(script), "--steps", str(STEPS)], NODES)


def update(run, *args: str) -> dict:
    out = subprocess.run([*CLI, "update", run.run_dir, *args, "--json"], env=run.env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def change(run, event: str, timeout: float = 120.0) -> dict:
    return wait_until(f"change-log event {event}", lambda: next(
        (c for c in vs.read_changes(run.run_dir) if c["event"] == event), None), timeout)


def markers(run, name: str) -> list[str]:
    out = []
    for log in sorted(Path(run.run_dir, "logs").rglob("rank0.log")):
        out += [ln for ln in log.read_text(errors="replace").splitlines()
                if ln.startswith(f"HOT-UPDATE-MARKER {name}")]
    return out


def test_now_switches_versions_at_a_step_boundary(runs, tmp_path):  # noqa: F811
    v2 = new_version(tmp_path, "v2")
    run = runs("hot-now", spares=0)
    run.wait_step(10)
    req = update(run, "--code", str(v2), "--now", "--args", NEW_ARGS, "-m", "data mix")
    assert req["version"] == 1 and req["mode"] == "now"
    end = run.wait_end()
    assert end["status"] == "completed", run.tail()
    resumed = change(run, "resumed", 5)
    restored = resumed["restored_step"]
    # The workers may finish (and snapshot) a step the controller has not yet counted
    # when they are stopped: restored >= the step the change was applied at.
    assert resumed["steps_redone"] == 0 and restored >= resumed["applied_step"]
    assert markers(run, "v2") == [f"HOT-UPDATE-MARKER v2 start={restored}"]
    incidents = run.events("incident")
    # The change is ByteRobust's manual class. A rendezvous that failed on a busy host
    # (a restart is then the ladder's job, not the change's) may add an in-place incident
    # that lost nothing; anything else fails here, with the evidence.
    (inc,) = [i for i in incidents if i["class"] == "code_data_change"]
    others = [(i["class"], i["rung"], i["steps_lost"], i.get("evidence"))
              for i in incidents if i is not inc]
    assert all(rung == "in_place" and lost == 0 for _, rung, lost, _ in others), others
    assert inc["class"] == "code_data_change" and inc["category"] == "manual"
    assert inc["steps_lost"] == 0 and inc["restored_step"] == restored
    assert end["params_sha256"] == reference_sha(tmp_path, restored)
    out = subprocess.run([*CLI, "changes", run.run_dir, "--json"], env=run.env,
                         capture_output=True, text=True, timeout=60)
    log = json.loads(out.stdout)
    assert log["current_version"] == 1
    assert [c["event"] for c in log["changes"]] == ["requested", "applied", "resumed"]


def test_at_next_restart_rides_an_injected_kill_worker(runs, tmp_path):  # noqa: F811
    v2 = new_version(tmp_path, "v2")
    run = runs("hot-restart", spares=0)
    run.wait_step(8)
    update(run, "--code", str(v2), "--at-next-restart", "--args", NEW_ARGS)
    change(run, "staged", 30)
    assert not markers(run, "v2")
    run.inject("kill-worker", "--rank", "1")
    end = run.wait_end()
    assert end["status"] == "completed", run.tail()
    applied = change(run, "applied", 5)
    assert applied["how"] == "restart"
    restored = change(run, "resumed", 5)["restored_step"]
    classes = sorted(i["class"] for i in run.events("incident"))
    assert classes == ["code_data_change", "worker_signal"], classes
    assert end["params_sha256"] == reference_sha(tmp_path, restored)


def test_at_next_restart_is_forced_at_its_deadline(runs, tmp_path):  # noqa: F811
    v2 = new_version(tmp_path, "v2")
    run = runs("hot-deadline", spares=0)
    run.wait_step(8)
    update(run, "--code", str(v2), "--at-next-restart", "--deadline", "2s",
           "--args", NEW_ARGS)
    end = run.wait_end()
    assert end["status"] == "completed", run.tail()
    assert change(run, "applied", 5)["how"] == "deadline"
    resumed = change(run, "resumed", 5)
    assert resumed["steps_redone"] == 0
    assert [i["class"] for i in run.events("incident")] == ["code_data_change"]
    assert end["params_sha256"] == reference_sha(tmp_path, resumed["restored_step"])


@pytest.mark.parametrize(("bug", "error_class"), [("typeerror", "user_exception"),
                                                  ("silent_exit", "worker_signal")])
def test_a_broken_new_version_rolls_back(runs, tmp_path, baseline_sha,  # noqa: F811
                                         bug, error_class):
    v3 = new_version(tmp_path, "v3", bug=bug)
    run = runs(f"hot-rollback-{bug}", spares=0)
    run.wait_step(8)
    update(run, "--code", str(v3), "--now", "-m", "a broken change")
    end = run.wait_end()
    assert end["status"] == "completed", run.tail()
    rolled = change(run, "rolled_back", 5)
    assert rolled["from_version"] == 1 and rolled["version"] == 0
    (inc,) = run.events("incident")  # the failure's own incident records the rollback
    assert inc["class"] == "code_data_change" and inc["rung"] == "in_place"
    assert inc["evidence"]["error_class"] == error_class
    assert "failed with code_data_change" in inc["evidence"]["rollback"]
    assert vs.read_current(run.run_dir)["version"] == 0
    # The broken version finished no step: the pre-change snapshot was restored, and the
    # run ends as if nothing had changed.
    assert end["params_sha256"] == baseline_sha


def test_a_requeue_after_an_update_keeps_the_new_version(runs, tmp_path):  # noqa: F811
    v2 = new_version(tmp_path, "v2")
    run = runs("hot-requeue", spares=0)
    run.wait_step(8)
    update(run, "--code", str(v2), "--now", "--args", NEW_ARGS)
    switched = change(run, "resumed", 60)["restored_step"]
    run.wait_step(switched + 3)
    # The batch node (agent 0's): without a spare its loss takes the requeue rung, and the
    # next allocation's batch script starts the run again from its own config.
    victim = load_state(run.paths.state).members["0"]
    run.inject("kill-node", "--node", victim)
    runs.killed.append(victim)
    end = run.wait_end(timeout=300)
    assert end["status"] == "completed", run.tail()
    lost = [i for i in run.events("incident") if i["class"] == "node_lost"]
    assert [i["rung"] for i in lost] == ["requeue"], run.events("incident")
    assert load_state(run.paths.state).requeues == 1
    # v2 ran after the switch and again after the requeue, never the old version after it.
    assert len(markers(run, "v2")) == 2, markers(run, "v2")
    assert vs.read_current(run.run_dir)["version"] == 1
    assert end["params_sha256"] == reference_sha(tmp_path, switched)
