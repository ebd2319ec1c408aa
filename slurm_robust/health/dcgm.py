"""NVIDIA DCGM diagnostics (``dcgmi diag``): run one level, read its JSON verdict.

DCGM's levels match the break-fix loop's moments (NVIDIA's guidance): level 1 (seconds,
deployment and readiness), level 2 (about two minutes, after a failure), level 3 (about
fifteen minutes, a post-mortem with stress tests). ``dcgmi diag -r LEVEL -j`` prints one
JSON object; its layout changed between DCGM releases, and both are read:

- DCGM 2 and 3: ``{"DCGM GPU Diagnostic" | "DCGM Diagnostic": {"test_categories":
  [{"category", "tests": [{"name", "results": [{"status", "gpu_ids"?, "info"?,
  "warnings"?}]}]}]}}``, one result per GPU (or one for the node);
- DCGM 4: the same categories and tests, each test also with ``"test_summary":
  {"status"}``, which then decides.

A test's status is its summary's, else the worst of its results' (Fail > Warn > Pass >
Skip), in our words (``fail``, ``warn``, ``ok``, ``skip``). Only ``dcgmi`` on PATH is run,
with a timeout; a node without it has no reading (None), which the check reports as
skipped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

from slurm_robust.vocabulary import HealthStatus

#: Our statuses for DCGM's words, worst first (a DCGM "Pass" is our ``ok``).
WORST_FIRST = (HealthStatus.FAIL, HealthStatus.WARN, HealthStatus.OK, HealthStatus.SKIP)
#: DCGM's words as it prints them (matched without regard to case).
_DCGM_WORDS = {"Fail": HealthStatus.FAIL, "Warn": HealthStatus.WARN, "Pass": HealthStatus.OK,
               "Skip": HealthStatus.SKIP}
_INFO_MAX = 300


def parse_diag(text: str) -> list[dict[str, Any]]:
    """The tests of one ``dcgmi diag -j`` output: ``{name, category, status, info}``.
    Raises ValueError for output that is not a DCGM diagnostic."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError("dcgmi diag printed no JSON object")
    doc = json.loads(text[start:end + 1])
    body = next((doc[k] for k in ("DCGM Diagnostic", "DCGM GPU Diagnostic")
                 if isinstance(doc, dict) and isinstance(doc.get(k), dict)), None)
    if body is None or not isinstance(body.get("test_categories"), list):
        raise ValueError("dcgmi diag output has no 'DCGM Diagnostic' test_categories")
    tests = []
    for cat in body["test_categories"]:
        if not isinstance(cat, dict):
            continue
        for test in cat.get("tests") or ():
            if isinstance(test, dict):
                tests.append(_test(test, str(cat.get("category", ""))))
    return tests


def _test(test: dict[str, Any], category: str) -> dict[str, Any]:
    results = [r for r in test.get("results") or () if isinstance(r, dict)]
    summary = test.get("test_summary")
    if isinstance(summary, dict) and summary.get("status"):
        status = _status(summary.get("status"))
    else:
        statuses = [_status(r.get("status")) for r in results] or [HealthStatus.SKIP]
        status = min(statuses, key=WORST_FIRST.index)
    info = []
    for r in results:
        if _status(r.get("status")) in (HealthStatus.FAIL, HealthStatus.WARN):
            gpu = r.get("gpu_ids", r.get("gpu_id", r.get("entity_id")))
            words = _words(r.get("info")) or _words(r.get("warnings"))
            info.append(f"GPU {gpu}: {words}" if gpu not in (None, "") else words)
    return {"name": str(test.get("name", "?")), "category": category, "status": status.value,
            "info": "; ".join(i for i in info if i)[:_INFO_MAX]}


def _status(raw: Any) -> HealthStatus:
    """DCGM's word as our status; a word it did not print before is a warning."""
    text = str(raw or "").strip().lower()
    for word, status in _DCGM_WORDS.items():
        if text.startswith(word.lower()):
            return status
    return HealthStatus.SKIP if text in ("", "not run") else HealthStatus.WARN


def _words(raw: Any) -> str:
    if isinstance(raw, list):
        return " ".join(_words(x) for x in raw).strip()
    if isinstance(raw, dict):
        return str(raw.get("warning") or raw.get("message") or "")
    return "" if raw is None else " ".join(str(raw).split())


def run_diag(level: int, timeout_s: float) -> dict[str, Any] | None:
    """``dcgmi diag -r LEVEL -j`` here: ``{level, rc, tests}``; None without dcgmi.
    Raises ValueError for output that cannot be read (the check is then UNKNOWN)."""
    exe = shutil.which("dcgmi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "diag", "-r", str(int(level)), "-j"], capture_output=True,
                             text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise ValueError(f"dcgmi diag -r {level} did not finish in {timeout_s:g} s") from exc
    # dcgmi exits non-zero when a test fails; the JSON says which.
    return {"level": int(level), "rc": out.returncode, "tests": parse_diag(out.stdout)}
