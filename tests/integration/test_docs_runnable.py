"""The shell examples the docs mark ``<!-- runnable: cluster -->`` run on the session's
mini-cluster and print what the docs show (the format: tests/unit/docs/runnable.py)."""

from __future__ import annotations

import pytest

from tests.unit.docs.runnable import MARK_CLUSTER, Example, examples, run

pytestmark = pytest.mark.integration

CLUSTER = examples(MARK_CLUSTER)


@pytest.mark.parametrize("example", CLUSTER, ids=[e.id for e in CLUSTER])
def test_cluster_example(minicluster, example: Example) -> None:
    # The fixture has the cluster up; the example finds it as a user would
    # (`slurm-robust cluster env`, the checkout's .minicluster/).
    problem = run(example, timeout_s=300.0)
    assert problem is None, problem
