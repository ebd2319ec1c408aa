"""The integration suite's module order (tests/conftest.py): longest first, lifecycle last."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import LAST_MODULE, LONGEST_MODULES

INTEGRATION = Path(__file__).resolve().parents[2] / "integration"


def test_every_listed_module_exists_once():
    # A renamed module would drop out of the order silently and run in its alphabetical
    # place: the two workers would end apart again.
    present = {p.name for p in INTEGRATION.glob("test_*.py")}
    assert len(set(LONGEST_MODULES)) == len(LONGEST_MODULES)
    assert [m for m in (*LONGEST_MODULES, LAST_MODULE) if m not in present] == []
    assert LAST_MODULE not in LONGEST_MODULES
