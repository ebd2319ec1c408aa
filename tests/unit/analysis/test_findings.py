"""The in-job monitor's findings reach the post-mortem: read (never unread input) and
tied to the incident on the same node that followed them."""

from __future__ import annotations

from pathlib import Path

from slurm_robust.analysis.pipeline import analyse, load_inputs
from slurm_robust.analysis.report import sections
from slurm_robust.launcher.control.events import make_incident
from tests.unit.analysis.run_helpers import started_run


def test_a_finding_is_shown_with_the_incident_it_preceded(tmp_path: Path) -> None:
    run, log = started_run(tmp_path)
    for node, reason, seen in (("n2", "gpu_xid: Xid 79 on GPU 0", 104.0),
                               ("n1", "host_disk_free: 3 % free", 101.0)):
        log.emit("finding", {"finding_version": 1, "node": node, "agent": 1, "kind": "gpu",
                             "check": reason.split(":")[0], "severity": "fatal",
                             "class": "gpu_unavailable", "reason": reason,
                             "seen_at": seen, "evidence": {}}, now=seen + 0.2)
    inc = make_incident("i1", "gpu_unavailable", "explicit", 110.0, fault_time=104.0,
                        nodes=["n2"])
    inc.update(rung="spare", localized_at=110.5, recovered_at=113.0)
    log.incident(inc)
    log.emit("run_end", {"status": "completed", "step": 5}, now=120.0)

    an = analyse(load_inputs([run]))
    assert an.issues.total == 0  # finding events are read, not counted as unknown
    found = an.findings.set_index("node")
    assert found.loc["n2", "before_incident"] == "i1 gpu_unavailable +6.0 s"
    assert found.loc["n1", "before_incident"] == ""  # nothing followed on n1
    titles = [title for title, _, _ in sections(an)]
    assert "In-job monitor findings" in titles

