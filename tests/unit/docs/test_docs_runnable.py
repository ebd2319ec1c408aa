"""The shell examples the docs mark ``<!-- runnable -->`` run and print what the docs show
(the mini-cluster's ones are in tests/integration/test_docs_runnable.py)."""

from __future__ import annotations

import pytest

from tests.unit.docs.runnable import (
    MARK_CLUSTER,
    MARK_LOCAL,
    Example,
    by_block,
    examples,
    matches,
    run,
)

LOCAL = examples(MARK_LOCAL)
BLOCKS = by_block(LOCAL)


def test_there_are_runnable_examples() -> None:
    assert LOCAL, "no <!-- runnable --> block found in README.md or docs/"
    assert examples(MARK_CLUSTER), "no <!-- runnable: cluster --> block found"


@pytest.mark.parametrize("block", BLOCKS, ids=[b[0].id for b in BLOCKS])
def test_runnable_example(block: list[Example]) -> None:
    for example in block:  # in the doc's order: a command may read what one before wrote
        problem = run(example)
        assert problem is None, problem


def test_the_output_match_can_fail() -> None:
    assert matches(("a", "...", "z"), ["a", "b", "c", "z"])
    assert matches(("4 spares ... nodes",), ["4 spares cover 1024 nodes"])
    assert not matches(("4 spares",), ["3 spares"])
    assert not matches(("a",), ["a", "extra line"])
