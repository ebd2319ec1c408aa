"""docs/ARCHITECTURE.md stays true: its phase table is the code's, and its killed-worker
path names existing launcher files, at most 10, none visited twice."""

from __future__ import annotations

import re
from pathlib import Path

import slurm_robust.launcher
from slurm_robust.launcher.enums import PHASE_TRANSITIONS, Phase

DOC = Path(__file__).resolve().parents[3] / "docs" / "ARCHITECTURE.md"
LAUNCHER = Path(slurm_robust.launcher.__file__).parent


def section(name: str) -> str:
    text = DOC.read_text()
    match = re.search(rf"<!-- {name}: begin -->(.*?)<!-- {name}: end -->", text, re.S)
    assert match, f"{DOC} lacks the {name} markers"
    return match.group(1)


def test_the_phase_table_is_the_codes() -> None:
    table: dict[Phase, frozenset[Phase]] = {}
    for line in section("phase-table").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("From", "") or set(cells[0]) <= {"-"}:
            continue
        nexts = frozenset(Phase(p.strip()) for p in cells[1].split(",")
                          if not p.strip().startswith("("))
        table[Phase(cells[0])] = nexts
    assert table == PHASE_TRANSITIONS


def test_the_killed_worker_path_is_short_and_one_way() -> None:
    steps = re.findall(r"^\d+\. `launcher/([\w/]+\.py)`", section("killed-worker-path"), re.M)
    assert steps, "no numbered steps found"
    assert len(steps) <= 10
    assert len(set(steps)) == len(steps), f"a file is visited twice: {steps}"
    for rel in steps:
        assert (LAUNCHER / rel).is_file(), f"{rel} named in {DOC.name} does not exist"
