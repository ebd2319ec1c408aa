"""The rehearsal tooling is a distribution of its own: where it is not installed, the
library still works, and ``cluster``, ``bench``, ``inject`` and the GPU check say in one
line how to install it and exit non-zero (no traceback).

Each case runs a fresh interpreter in which the rehearsal package cannot be found (a
meta path finder refuses it, as a venv with the library alone would)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slurm_robust.tooling import REHEARSAL, REHEARSAL_MISSING, rehearsal_installed

BLOCK = f"""
import sys
class _NoRehearsal:
    def find_spec(self, name, path=None, target=None):
        if name == {REHEARSAL!r} or name.startswith({REHEARSAL!r} + "."):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name={REHEARSAL!r})
        return None
sys.meta_path.insert(0, _NoRehearsal())
"""


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    code = BLOCK + ("from slurm_robust.cli.main import main\n"
                    f"sys.exit(main({list(argv)!r}))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_the_rehearsal_tooling_is_installed_here() -> None:
    assert rehearsal_installed()


@pytest.mark.parametrize("argv", [("cluster", "up"), ("cluster", "status", "--json"),
                                  ("bench", "recovery", "--rounds", "2"), ("bench",),
                                  ("inject", "kill-worker", "--job", "1")])
def test_its_subcommands_say_how_to_install_it_in_one_line(argv: tuple[str, ...]) -> None:
    out = _cli(*argv)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert lines[0] == f"slurm-robust {argv[0]}: error: unavailable: {REHEARSAL_MISSING}"
    assert "pip install -e rehearsal/" in lines[0]


def test_help_lists_them_as_unavailable_and_the_library_commands_work() -> None:
    out = _cli("--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "cluster unavailable: needs the rehearsal tooling" in text
    assert "bench unavailable:" in text and "inject unavailable:" in text
    assert _cli("submit", "--help").returncode == 0


def test_the_gpu_check_says_how_to_install_it() -> None:
    code = BLOCK + ("import runpy\n"
                    "runpy.run_module('slurm_robust.ckpt.gpu_check', run_name='__main__',"
                    " alter_sys=True)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip() == f"python -m slurm_robust.ckpt.gpu_check: {REHEARSAL_MISSING}"


def test_the_gpu_check_runs_with_both_installed() -> None:
    # Without CUDA the check prints {"cuda": false, ...} and exits 2 (see ckpt_gpu.py).
    out = subprocess.run([sys.executable, "-m", "slurm_robust.ckpt.gpu_check"],
                         capture_output=True, text=True, timeout=300)
    assert '"cuda": false' in out.stdout or out.returncode == 0, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
