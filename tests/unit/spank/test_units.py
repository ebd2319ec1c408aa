"""The SPANK plugin's C code without Slurm: its self-tests, its records read by Python,
and a clean build that exports only what Slurm looks up.

The C driver (spank/tests/test_spank.c) links the same pure sources the plugin links
(values.c, config.c, request.c, journal.c), so these tests exercise the code that
slurmstepd runs, not a copy of it.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from slurm_robust.records import (
    TASK_EXIT_SCHEMA,
    TASK_EXIT_VERSION,
    append_record,
    make_record,
    read_records,
)

SPANK_DIR = Path(__file__).resolve().parents[3] / "spank"
SELF_TESTS = ["count", "profile", "printable", "config", "request", "expand", "escape",
              "steps", "format_small_buffer", "lock_timeout", "path_components", "fifo_refused",
              "untrusted_files"]
SLURM_HEADER = Path("/usr/include/slurm/spank.h")

needs_cc = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                              reason="needs a C compiler and make")


def _run(argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Build spank/tests/test_spank.c into a temporary directory."""
    if shutil.which("cc") is None or shutil.which("make") is None:
        pytest.skip("needs a C compiler and make")
    binary = tmp_path_factory.mktemp("spank") / "test_spank"
    proc = _run(["make", "-s", "-C", str(SPANK_DIR), f"TEST_BIN={binary}", str(binary)],
                timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(binary)


def test_driver_lists_every_self_test(driver: str) -> None:
    proc = _run([driver, "list"])
    assert proc.returncode == 0
    assert proc.stdout.split() == SELF_TESTS


@pytest.mark.parametrize("name", SELF_TESTS)
def test_c_self_test(driver: str, name: str) -> None:
    proc = _run([driver, "run", name])
    assert proc.returncode == 0, proc.stderr


def _format(driver: str, node: str, job: int, step: int, task: int, status: int) -> dict:
    proc = _run([driver, "format", node, str(job), str(step), str(task), str(status)])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("\n") and proc.stdout.count("\n") == 1
    return json.loads(proc.stdout)


@pytest.mark.parametrize(
    ("status", "exit_code", "sig", "core"),
    [
        (0, 0, None, False),
        (3 << 8, 3, None, False),
        (255 << 8, 255, None, False),
        (int(signal.SIGKILL), None, 9, False),
        (int(signal.SIGSEGV) | 0x80, None, 11, True),
    ],
    ids=["exit0", "exit3", "exit255", "sigkill", "sigsegv_core"],
)
def test_record_tells_exit_code_from_signal(driver: str, status: int, exit_code: int | None,
                                            sig: int | None, core: bool) -> None:
    rec = _format(driver, "node1", 42, 0, 3, status)
    assert rec["schema"] == TASK_EXIT_SCHEMA and rec["v"] == TASK_EXIT_VERSION
    assert isinstance(rec["time"], float)
    assert rec["node"] == "node1" and rec["job_id"] == "42" and rec["step_id"] == "0"
    assert rec["task_id"] == 3 and isinstance(rec["pid"], int)
    assert rec["wait_status"] == status
    assert rec["exit_code"] == exit_code and rec["signal"] == sig
    assert rec["core_dumped"] is core
    if exit_code is not None:
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == exit_code
    else:
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == sig


def test_batch_step_is_named_and_strings_are_escaped(driver: str) -> None:
    rec = _format(driver, 'we"ird\\node\n', 7, 0xFFFFFFFB, 0, 0)
    assert rec["step_id"] == "batch"
    assert rec["node"] == 'we"ird\\node\n'


def _c_appender(driver: str, path: str, n: int) -> None:
    for _ in range(n):
        subprocess.run([driver, "append", path, "node1", "9"], check=True, timeout=30)


def _py_appender(path: str, n: int) -> None:
    for i in range(n):
        append_record(path, make_record(TASK_EXIT_SCHEMA, TASK_EXIT_VERSION,
                                        {"node": "py", "i": i, "pad": "x" * 2000}))


def test_c_and_python_appends_share_the_lock_and_never_tear(driver: str,
                                                            tmp_path: Path) -> None:
    path = str(tmp_path / "state" / "task_exit.jsonl")
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_c_appender, args=(driver, path, 40)) for _ in range(2)]
    procs.append(ctx.Process(target=_py_appender, args=(path, 150)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    result = read_records(path, schema=TASK_EXIT_SCHEMA)
    assert result.malformed == 0
    from_c = [r for r in result.records if r["node"] == "node1"]
    assert len(from_c) == 80 and all(r["signal"] == 9 for r in from_c)
    assert len(result.records) == 230
    mode = os.stat(path).st_mode & 0o777
    assert mode & 0o022 == 0, oct(mode)


def test_append_refuses_a_missing_grandparent(driver: str, tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "task_exit.jsonl"
    proc = _run([driver, "append", str(path), "node1", "0"])
    assert proc.returncode == 1
    assert "cannot create directory" in proc.stderr and not path.exists()


@needs_cc
@pytest.mark.skipif(not SLURM_HEADER.exists(), reason="needs slurm/spank.h (libslurm-dev)")
def test_clean_build_is_hardened_and_exports_only_spank_symbols(tmp_path: Path) -> None:
    src = tmp_path / "spank"
    shutil.copytree(SPANK_DIR, src, ignore=shutil.ignore_patterns("*.o", "*.so", "test_spank"))
    proc = _run(["make", "-s", "-C", str(src)], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    so = src / "slurm_robust_spank.so"
    assert so.exists() and not list(src.glob("*.tmp.*"))
    nm = _run(["nm", "-D", "--defined-only", str(so)])
    exported = sorted(line.split()[-1] for line in nm.stdout.splitlines() if line.strip())
    assert exported == ["plugin_name", "plugin_type", "plugin_version", "slurm_spank_init",
                        "slurm_spank_init_post_opt", "slurm_spank_task_exit",
                        "spank_plugin_version"]
    dyn = _run(["readelf", "-d", str(so)]).stdout
    assert "BIND_NOW" in dyn
    headers = _run(["readelf", "-lW", str(so)]).stdout
    assert "GNU_RELRO" in headers
    stack = [line for line in headers.splitlines() if "GNU_STACK" in line]
    assert stack and "RWE" not in stack[0]
    proc = _run(["make", "-s", "-C", str(src), "clean"])
    assert proc.returncode == 0 and not so.exists()
