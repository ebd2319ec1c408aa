"""The fork server (launcher/node/forkserver.py) and the agent's side of it, run for real.

Most servers here pre-import only ``json`` (fast); one imports numpy, as torch does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_robust.launcher.node import forkserver_client as fs_client
from slurm_robust.launcher.node import workers as wk
from slurm_robust.launcher.node.forkserver_client import ForkServer, ServedProcess
from slurm_robust.launcher.node.worker_order import WorkerOrder

SCRIPT = """
import json, os, signal, sys, time
mode = sys.argv[1]
print(json.dumps({"argv": sys.argv, "rank": os.environ.get("RANK"), "cwd": os.getcwd(),
                  "path0": sys.path[0], "ppid": os.getppid(),
                  "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
                  "sigint": str(signal.getsignal(signal.SIGINT))}), flush=True)
if mode == "rng":
    import numpy
    print(json.dumps({"rng": numpy.random.rand()}), flush=True)
if mode == "sleep":
    time.sleep(60)
if mode == "brief":
    time.sleep(1.0)
if mode == "fail":
    raise ValueError("boom")
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
"""


@pytest.fixture
def served(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    servers: list[ForkServer] = []

    def make(preload: tuple[str, ...] = ("json",)) -> ForkServer:
        server = ForkServer([sys.executable, str(script)], preload, dict(os.environ))
        server.start()
        servers.append(server)
        return server

    yield make, script, tmp_path
    for server in servers:
        if server.proc is not None and server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


def order(server: ForkServer, script: Path, tmp: Path, name: str, *args: str,
          rank: str = "3") -> ServedProcess:
    proc = server.spawn(WorkerOrder([str(script), *args], {**os.environ, "RANK": rank},
                                    str(tmp), str(tmp / f"{name}.log")))
    assert proc is not None
    return proc


def first_line(tmp: Path, name: str) -> dict:
    return json.loads((tmp / f"{name}.log").read_text().splitlines()[0])


def test_a_fork_runs_the_script_as_python_would(served):
    make, script, tmp = served
    server = make()
    proc = order(server, script, tmp, "a", "exit", "7")
    assert proc.wait(30) == 7
    out = first_line(tmp, "a")
    assert out["argv"] == [str(script), "exit", "7"] and out["rank"] == "3"
    assert out["cwd"] == str(tmp) and out["path0"] == str(tmp)
    # A fresh interpreter's handlers, not the server's (which ignores SIGTERM).
    assert out["sigterm_default"] and "default_int_handler" in out["sigint"]
    assert out["ppid"] == server.proc.pid  # the server's child, reported through it
    failed = order(server, script, tmp, "f", "fail")
    assert failed.wait(30) == 1
    assert "ValueError: boom" in (tmp / "f.log").read_text()


def test_orders_before_the_server_is_ready_are_pending_then_start(served):
    make, script, tmp = served
    server = make()
    proc = order(server, script, tmp, "early", "exit", "0")
    assert server.ready_at is None and proc.pid is None  # still importing
    assert proc.wait(30) == 0 and proc.pid is not None
    assert server.ready_at is not None and server.mode == "fork"


def test_a_pending_worker_that_is_stopped_never_runs(served):
    make, script, tmp = served
    server = make()
    proc = order(server, script, tmp, "never", "sleep")
    proc.send_signal(signal.SIGTERM)
    assert proc.poll() == -signal.SIGKILL  # at once: the server is still importing
    assert order(server, script, tmp, "next", "exit", "0").wait(30) == 0
    assert proc.pid is None and not (tmp / "never.log").exists()


def server_preloading(tmp: Path, module: str, source: str
                      ) -> tuple[ForkServer, Path, dict[str, str]]:
    """A started server whose one pre-import is ``module`` (``source``, written in
    ``tmp``), for the script SCRIPT; its script and environment with it."""
    (tmp / f"{module}.py").write_text(source)
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": f"{tmp}:{os.environ.get('PYTHONPATH', '')}"}
    server = ForkServer([sys.executable, str(script)], (module,), env)
    server.start()
    return server, script, env


def test_stopping_a_pending_worker_does_not_wait_for_the_import(tmp_path):
    server, script, env = server_preloading(tmp_path, "slowmod",
                                            "import time\ntime.sleep(5)\n")
    try:
        pending = wk.spawn([sys.executable, str(script), "sleep"], env, 0, 0, 1,
                           tmp_path / "w.log", tmp_path / "p.jsonl", server)
        t0 = time.monotonic()
        wk.stop_workers([pending], grace_s=1.0)
        # Not the import's 5 s: an agent stopping a generation keeps its heartbeats.
        assert time.monotonic() - t0 < 2.0
        assert pending.popen.returncode == -signal.SIGKILL and server.ready_at is None
        after = order(server, script, tmp_path, "after", "exit", "3")
        assert after.wait(30) == 3 and not (tmp_path / "w.log").exists()
    finally:
        server.proc.kill()
        server.proc.wait()


def test_slurm_s_sigterm_ends_the_worker_not_the_server(served):
    make, script, tmp = served
    server = make()
    proc = order(server, script, tmp, "s", "sleep")
    wait_started(proc)
    os.kill(server.proc.pid, signal.SIGTERM)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM
    assert server.proc.poll() is None
    assert order(server, script, tmp, "after", "exit", "0").wait(30) == 0


def test_an_exited_worker_stays_a_zombie_until_the_agent_has_its_status(served):
    make, script, tmp = served
    server = make()
    proc = order(server, script, tmp, "z", "sleep")
    wait_started(proc)
    pid = proc.pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while wk.process_state(pid) != "Z":
        assert time.monotonic() < deadline, "the killed worker was reaped unasked"
        time.sleep(0.01)
    time.sleep(0.3)
    assert wk.process_state(pid) == "Z"  # no reap before the agent took the status
    assert proc.poll() == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while wk.process_state(pid) is not None:
        assert time.monotonic() < deadline, "reap never happened"
        time.sleep(0.01)


def test_workers_die_with_their_server_and_later_ones_start_plainly(served, tmp_path):
    make, script, tmp = served
    server = make()
    proc = order(server, script, tmp, "orphan", "sleep")
    wait_started(proc)
    pid = proc.pid
    server.proc.kill()
    assert proc.wait(30) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while wk.process_state(pid) not in (None, "Z"):
        assert time.monotonic() < deadline, "the worker outlived its server"
        time.sleep(0.01)
    assert server.spawn(WorkerOrder([str(script), "exit", "0"], dict(os.environ), str(tmp),
                                    str(tmp / "x.log"))) is None
    worker = wk.spawn([sys.executable, str(script), "exit", "0"], dict(os.environ), 0, 0, 1,
                      tmp_path / "plain.log", tmp_path / "p.jsonl", server)
    assert isinstance(worker.popen, subprocess.Popen) and worker.popen.wait(30) == 0


def test_forks_do_not_share_the_numpy_random_state(served):
    make, script, tmp = served
    server = make(("numpy",))
    procs = [order(server, script, tmp, f"r{i}", "rng") for i in range(2)]
    assert [p.wait(60) for p in procs] == [0, 0]
    draws = {json.loads((tmp / f"r{i}.log").read_text().splitlines()[1])["rng"]
             for i in range(2)}
    assert len(draws) == 2


def test_stop_workers_ends_forks_and_pending_ones_alike(served, tmp_path):
    make, script, tmp = served
    server = make()
    running = wk.spawn([sys.executable, str(script), "sleep"], dict(os.environ), 0, 0, 1,
                       tmp_path / "w0.log", tmp_path / "p0.jsonl", server)
    wait_started(running.popen)
    pending = wk.spawn([sys.executable, str(script), "sleep"], dict(os.environ), 1, 1, 1,
                       tmp_path / "w1.log", tmp_path / "p1.jsonl", server)
    wk.stop_workers([running, pending], grace_s=5.0)
    assert running.popen.returncode == -signal.SIGTERM
    assert pending.popen.returncode in (-signal.SIGKILL, -signal.SIGTERM)
    server.close()
    assert server.proc.returncode == 0  # it ended on the closed channel, nothing left


def test_a_closing_server_reaps_exits_the_agent_never_answered(served):
    # A cancelled fork counts as ended on the agent's side at once; the server's "exited"
    # for it may never be read, so no "reap" comes. Closing must not wait on it for ever.
    make, script, tmp = served
    server = make()
    proc = order(server, script, tmp, "quick", "brief", "0")
    wait_started(proc)  # the worker runs 1 s; the agent reads nothing more meanwhile
    deadline = time.monotonic() + 30
    while not fs_client._gone(proc.pid):
        assert time.monotonic() < deadline, "the worker never exited"
        time.sleep(0.01)
    time.sleep(0.2)  # the server has seen the exit and said so; the agent does not read it
    server.proc.stdin.close()
    assert server.proc.wait(timeout=10) == 0
    server.dead = True


def test_a_command_of_another_interpreter_is_not_served(tmp_path):
    server = ForkServer(["/usr/bin/env", "python3", "x.py"], ("json",), {})
    server.start()
    assert not server.enabled and server.proc is None
    assert server.spawn(WorkerOrder(["x.py"], {}, str(tmp_path), str(tmp_path / "l"))) is None


def wait_started(proc: ServedProcess, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while proc.pid is None:
        assert time.monotonic() < deadline, "the fork server never started the worker"
        proc.server.pump(0.1)


def test_modules_are_imported_on_the_thread_every_worker_is_forked_from(tmp_path):
    # A thread's task outlives Thread.join by milliseconds, still running its exit path;
    # a fork in that window can copy a held lock into the worker for good (forkserver.py).
    # So the server imports on its main thread and forks with no other thread of its own.
    server, script, _ = server_preloading(
        tmp_path, "probe", "import os, threading\n"
        f"open({str(tmp_path / 'tid')!r}, 'w').write("
        "f'{threading.get_native_id()} {os.getpid()}')\n")
    try:
        proc = order(server, script, tmp_path, "after", "sleep")
        wait_started(proc)
        tid, pid = (tmp_path / "tid").read_text().split()
        assert tid == pid == str(server.proc.pid)
        assert len(os.listdir(f"/proc/{server.proc.pid}/task")) == 1
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        server.proc.kill()
        server.proc.wait()


def test_a_server_whose_imports_initialised_cuda_execs_fresh_interpreters(tmp_path):
    # No GPU here: a stand-in "torch" whose cuda says it is initialised, on the server's
    # path only, is what the real check reads (torch.cuda.is_initialized()).
    fake = tmp_path / "fakes" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("from torch import cuda\n")
    (fake / "cuda.py").write_text("def is_initialized():\n    return True\n")
    script = tmp_path / "train.py"
    script.write_text("import os, sys\nprint(os.getpid(), 'torch' in sys.modules)\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'fakes'}"}
    server = ForkServer([sys.executable, str(script)], ("torch",), env)
    server.start()
    try:
        proc = order(server, script, tmp_path, "execd", "x")
        assert proc.wait(30) == 0
        pid, imported = (tmp_path / "execd.log").read_text().split()
        # A fresh interpreter: the fake torch is not in it (the fork had it imported).
        assert imported == "False" and int(pid) == proc.pid
        assert server.mode == "exec"
    finally:
        server.close()
