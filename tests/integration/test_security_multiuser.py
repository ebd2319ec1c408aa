"""A hostile second user against a running robust job.

`robust` runs examples/train_gpt.py through the launcher; `mallory` (a second
unprivileged account created by `cluster up`) tries, during that run, what wave 1 let
her do: pre-create the job's checkpoint directories and plant links and a copy that
would execute code if unpickled, make the kernel log lines that begin like an Xid, a
panic or an OOM kill (a faulting process's name starts the kernel's segfault line), read
the controller's address and key, connect to the
controller with a forged report and a malformed exit record, hold a flock on the root
journals while the job's prologs and task exits append, and run a process whose name
is not UTF-8 while the prologs check for stray processes; then, while the job trains,
open 2,000 connections to its /metrics endpoint that never finish a request, hold 40
unauthenticated connections to the controller, answer its challenge with a MAC that is
not ASCII, and write into the run's durable checkpoint root. A worker is killed mid-run
so the restore path reads the checkpoint tiers. Every attack must be refused, the run
must end with the fault-free params_sha256, and no node may be left drained.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import test_launcher_faults as faults

#: The fault-free digest fixture of the launcher tests (same example, same settings).
baseline_sha = faults.baseline_sha
NODES, Run = faults.NODES, faults.Run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: mallory's long-running helper: non-UTF-8 name, flocks on every root journal.
HOLDER = textwrap.dedent("""
    import ctypes, fcntl, sys, time
    ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b"\\xff\\xfe-mallory\\xc3"), 0, 0, 0)
    held = []
    for path in sys.argv[2:]:
        try:
            fh = open(path, "rb")
            fcntl.flock(fh, fcntl.LOCK_EX)
            held.append(fh)
        except OSError as exc:
            print("could not hold", path, exc, flush=True)
    print("holding", len(held), flush=True)
    time.sleep(float(sys.argv[1]))
""")

#: mallory plants directories, links and a pickle copy for the next job ids.
PLANTER = textwrap.dedent("""
    import json, os, pickle, sys
    marker, nodes, roots, first, count = sys.argv[1], sys.argv[2].split(","), \\
        json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])

    class Evil:
        def __reduce__(self):
            return (open, (marker, "w"))

    payload = b"SRCKPT1\\n" + (2).to_bytes(8, "big") + b"{}" + pickle.dumps(Evil())
    planted = 0
    for job in range(first, first + count):
        for node in nodes:
            shm, local = roots["shm"].replace("{node}", node), roots["local"].replace(
                "{node}", node)
            d = os.path.join(shm, str(job), node, "rank0")
            os.makedirs(d, exist_ok=True)
            for name in ("slot0", "slot1", "backup0"):
                open(os.path.join(d, name + ".meta"), "wb").write(payload)
                open(os.path.join(d, name + ".data"), "wb").write(b"\\0" * 4096)
            link = os.path.join(local, node, str(job))
            os.makedirs(os.path.dirname(link), exist_ok=True)
            if not os.path.lexists(link):
                os.symlink(os.path.expanduser("~robust"), link)
            planted += 1
    print(planted)
""")

#: mallory talks to the controller: without the secret, then with garbage.
CONNECT = textwrap.dedent("""
    import json, socket, sys
    host, port, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    out = {}
    def attempt(name, lines):
        s = socket.create_connection((host, port), timeout=10)
        f = s.makefile("rwb")
        try:
            first = f.readline()
            out[name + "_greeting"] = json.loads(first).get("auth") if first else None
            for line in lines:
                f.write((json.dumps(line) + "\\n").encode()); f.flush()
            reply = f.readline()
            out[name] = reply.decode() if reply else "closed"
        except OSError as exc:
            out[name] = "closed: " + type(exc).__name__
        finally:
            s.close()
    report = {"op": "report", "key": key, "agent": 1, "node": "node2", "pid": 1, "gen": 0,
              "exits": [], "progress": [], "states": {}, "stacks": {}}
    attempt("forged_report", [report])
    attempt("forged_auth", [{"auth": "response", "nonce": "0" * 32, "mac": "f" * 64}])
    bad_exit = dict(report, exits=[{"gen": 0, "rank": 0, "exit_code": 1, "time": 1.0}])
    attempt("malformed_exit", [{"auth": "response", "nonce": "0" * 32, "mac": "0" * 64},
                               bad_exit])
    try:
        open(sys.argv[4]).read()
        out["controller_json"] = "readable"
    except OSError as exc:
        out["controller_json"] = type(exc).__name__
    print(json.dumps(out))
""")


#: mallory floods the run's endpoints while it trains (metrics and the controller's
#: pre-authentication slots), tries a non-ASCII MAC and the durable checkpoint root.
FLOOD = textwrap.dedent("""
    import json, os, resource, socket, sys, time
    mhost, mport, chost, cport = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    hold_s, ckpt_root = float(sys.argv[5]), sys.argv[6]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    out = {"metrics_opened": 0, "metrics_failed": 0, "preauth_opened": 0}
    held = []
    for _ in range(2000):
        try:
            s = socket.create_connection((mhost, mport), timeout=2)
            s.sendall(b"GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n")  # never ends it
            held.append(s)
            out["metrics_opened"] += 1
        except OSError:
            out["metrics_failed"] += 1
    preauth = []
    for _ in range(40):
        try:
            preauth.append(socket.create_connection((chost, cport), timeout=2))
            out["preauth_opened"] += 1
        except OSError:
            pass
    print("opened", flush=True)  # the test crashes a worker now: restores under the flood
    try:
        s = socket.create_connection((chost, cport), timeout=10)
    except OSError as exc:  # said in the result, so the test shows the run's state
        s = None
        out["non_ascii_mac"] = "not connected: " + type(exc).__name__
    f = s.makefile("rwb") if s is not None else None
    try:
        if f is None:
            raise OSError("not connected")
        f.readline()
        mac = "\\u00e9" * 64
        f.write((json.dumps({"auth": "response", "nonce": "0" * 32, "mac": mac},
                            ensure_ascii=False) + "\\n").encode())
        f.flush()
        reply = f.readline()
        out["non_ascii_mac"] = reply.decode() if reply else "closed"
    except OSError as exc:
        out.setdefault("non_ascii_mac", "closed: " + type(exc).__name__)
    finally:
        if s is not None:
            s.close()
    try:
        open(os.path.join(ckpt_root, "planted"), "w").close()
        out["ckpt_root"] = "writable"
    except OSError as exc:
        out["ckpt_root"] = type(exc).__name__
    # One byte every 2 s kept a slot for hours when the deadline was per read.
    closed = set()
    end = time.monotonic() + hold_s
    while time.monotonic() < end:
        for i, conn in enumerate(preauth):
            if i not in closed:
                try:
                    conn.sendall(b"{")
                except OSError:
                    closed.add(i)
        time.sleep(2)
    out["preauth_closed"] = len(closed)
    print(json.dumps(out))
""")


#: mallory's processes fault under names that open kernel-log formats: the kernel prints
#: "<comm>[pid]: segfault at ..." with her chosen name (15 bytes) at the line's start.
CRASH = textwrap.dedent("""
    import ctypes, sys
    ctypes.CDLL(None).prctl(15, ctypes.c_char_p(sys.argv[1].encode()), 0, 0, 0)
    ctypes.string_at(0)
""")
CRASH_NAMES = ("NVRM: Xid (PCI:", "Kernel panic - ", "Out of memory: ", "INFO: task ",
               "blk_update_requ")


def _kernel_times() -> list[tuple[float, str]]:
    """The kernel log's lines with their timestamps (seconds since boot)."""
    dmesg = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30)
    out = []
    for ln in dmesg.stdout.splitlines():
        stamp, _, rest = ln.partition("]")
        try:
            out.append((float(stamp.lstrip("[ ")), rest))
        except ValueError:
            continue
    return out


def _kernel_log_attack(user: str) -> int:
    """Fault one process per name; returns how many kernel-log lines that carry the names
    appeared (none where the kernel does not log user faults: debug.exception-trace 0).
    Counted by timestamp, not as a difference of counts: the ring buffer is finite, and
    on a long-lived machine the new lines push as many old ones of the same names out."""
    lines = _kernel_times()
    since = lines[-1][0] if lines else -1.0
    for name in CRASH_NAMES:
        crashed = _as(user, CRASH, name)
        assert crashed.returncode in (-signal.SIGSEGV, 128 + signal.SIGSEGV), crashed
    return sum(1 for t, ln in _kernel_times() if t > since and "segfault at" in ln
               and any(f"{n}[" in ln for n in CRASH_NAMES))


def _as(user: str, code: str, *args: str, timeout: float = 60.0, env=None):
    return subprocess.run(["runuser", "-u", user, "--", sys.executable, "-c", code, *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def _next_job_id(cluster) -> int:
    out = subprocess.run(["sbatch", "--parsable", "--hold", "-p", "train", "--wrap", "true"],
                         env=cluster.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    job = int(out.stdout.strip().split(";")[0])
    subprocess.run(["scancel", str(job)], env=cluster.env, timeout=30)
    return job + 1


def _drained(cluster) -> list[str]:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=cluster.env,
                         capture_output=True, text=True, timeout=30)
    return sorted({ln.split()[0] for ln in out.stdout.splitlines()
                   if any(s in ln.split()[1] for s in ("drain", "drng", "drained"))})


def test_a_second_user_cannot_steer_drain_or_run_code_in_a_robust_job(minicluster,
                                                                      baseline_sha):
    cfg = minicluster.cfg
    for user in (cfg.user, cfg.attacker):
        try:
            pwd.getpwnam(user)
        except KeyError:
            pytest.skip(f"no user {user!r} (run `slurm-robust cluster up` as root)")
    site = json.loads(cfg.robust_conf.read_text())
    nodes = [*cfg.train_nodes, *cfg.spare_nodes]
    assert _drained(minicluster) == [], "a node was drained before the test"
    marker = f"/tmp/sr-pwned-{os.getpid()}"
    # 1. mallory pre-creates the next jobs' checkpoint directories, links and a copy.
    first = _next_job_id(minicluster)
    plant = _as(cfg.attacker, PLANTER, marker, ",".join(nodes),
                json.dumps({"shm": site["shm_root"], "local": site["local_root"]}),
                str(first), "3")
    assert plant.returncode == 0, plant.stderr
    # 2. mallory holds flocks on every root journal and runs a non-UTF-8 process.
    journals = []
    for node in nodes:
        state = Path(site["state_dir"].replace("{node}", node))
        for path in (state / "health" / f"{node}.jsonl", state / "task_exit.jsonl"):
            if not path.exists():  # root's journals exist from any earlier job; make sure
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch(mode=0o644)
            journals.append(str(path))
    holder = subprocess.Popen(["runuser", "-u", cfg.attacker, "--", sys.executable, "-c",
                               HOLDER, "240", *journals], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == f"holding {len(journals)}"
        # 3. robust's run starts while the locks are held and the odd name is listed.
        # Steps padded to 0.6 s (the digest does not depend on it): ~20 s of run after step 8,
        # while mallory talks, crashes processes and opens 2,000 connections. With 0.2 s
        # steps a loaded fresh-clone run had ended 8 s after the kill, 1,370 connections in,
        # and the rest were refused by a controller that had finished.
        run = Run(minicluster, "security", 1, user=cfg.user,
                  train_args=["--steps", str(faults.STEPS), "--min-step-time", "0.6"])
        run.wait_step(8)
        info_mode = Path(run.paths.controller).stat().st_mode & 0o777
        assert info_mode == 0o600
        info = json.loads(Path(run.paths.controller).read_text())
        talk = _as(cfg.attacker, CONNECT, info["host"], str(info["port"]), info["key"],
                   str(run.paths.controller))
        assert talk.returncode == 0, talk.stderr
        seen = json.loads(talk.stdout)
        assert seen["controller_json"] == "PermissionError"
        for name in ("forged_report", "forged_auth", "malformed_exit"):
            assert seen[name].startswith("closed"), seen  # never a plan
        # 4. mallory's faulting processes write kernel-log lines that start like an Xid, a
        # panic, an OOM kill, a hung task and a block-layer error: no node may be blamed.
        if Path("/proc/sys/debug/exception-trace").read_text().strip() == "1":
            assert _kernel_log_attack(cfg.attacker) >= 1  # the kernel did log her names
        # 5. mallory floods /metrics and the controller's pre-authentication slots while
        # a worker crash makes every rank restore from the (private) memory tier.
        metrics = json.loads((Path(run.run_dir) / "metrics.json").read_text())
        flood = subprocess.Popen(
            ["runuser", "-u", cfg.attacker, "--", sys.executable, "-c", FLOOD,
             metrics["host"], str(metrics["port"]), info["host"], str(info["port"]), "15",
             str(run.paths.durable)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        assert flood.stdout is not None
        opened = flood.stdout.readline()  # its connections are open and held
        run.inject("kill-worker", "--rank", str(NODES - 1))
        flooded, flood_err = flood.communicate(timeout=240)
        assert flood.returncode == 0 and opened == "opened\n", (opened, flood_err)
        seen = json.loads(flooded)
        assert seen["metrics_opened"] == 2000, (seen, run.tail())  # the oldest closed at the cap
        assert seen["non_ascii_mac"].startswith("closed"), (seen, run.tail())
        # every held pre-authentication slot closed by the handshake's total deadline
        assert seen["preauth_opened"] > 0, seen
        assert seen["preauth_closed"] == seen["preauth_opened"], seen
        assert seen["ckpt_root"] == "PermissionError", seen
        end = run.wait_end()
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=30)
    assert end["status"] == "completed" and end["params_sha256"] == baseline_sha, end
    incidents = run.events("incident")
    assert [(i["class"], i["rung"]) for i in incidents] == [("worker_signal", "in_place")]
    restored = [e for e in run.events() if e.get("restore_tier")]
    assert all(e["restore_tier"] in ("memory", "peer") for e in restored), restored
    assert not Path(marker).exists(), "mallory's pickle ran as robust"
    assert len(run.events("run_start")) == 1, "the job was requeued (a prolog failed?)"
    assert _drained(minicluster) == []
    # robust's own checkpoint directories are private and carry the unguessable key
    shm = Path(site["shm_root"].replace("{node}", nodes[0]))
    robust_uid = pwd.getpwnam(cfg.user).pw_uid
    for d in shm.iterdir():
        if d.name.startswith(f"{run.job_id}.") and d.stat().st_uid == robust_uid:
            assert d.stat().st_mode & 0o077 == 0
