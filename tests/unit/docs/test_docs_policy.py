"""README.md stays a front door, and the repository explains itself: no comment, doc or
test points at a tracker entry by number (the word and a number) instead of saying what
it means."""

from __future__ import annotations

import re
import subprocess

from tests.unit.docs.docindex import REPO

README_MAX_LINES = 250

#: A reference to this project's tracker by number. One to an external tracker carries
#: its URL on the same line (a corpus entry, a pytorch issue) and is fine.
TRACKER_REF = re.compile(r"\bissues? ?#?[0-9]+", re.I)
#: Where the rule applies: code, docs and tests (not the failure corpus, whose entries
#: quote public issue threads by their URLs).
SCOPES = ("slurm_robust", "rehearsal", "ckpt", "analysis", "prolog", "epilog", "examples",
          "spank", "tests", "docs", "README.md", "Makefile", "setup.cfg", "pyproject.toml")
EXCLUDED = ("tests/data/",)


def tracker_refs() -> dict[str, list[str]]:
    files = subprocess.run(["git", "ls-files", "--", *SCOPES], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    found: dict[str, list[str]] = {}
    for rel in files:
        if rel.startswith(EXCLUDED) or not (REPO / rel).is_file():
            continue
        try:
            text = (REPO / rel).read_text()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if TRACKER_REF.search(line) and "://" not in line:
                found.setdefault(rel, []).append(f"{rel}:{n}: {line.strip()}")
    return found


def test_readme_is_a_front_door() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail to the "
        "page of docs/ for its reader and link it from the README's map")


def test_readme_has_nothing_dated() -> None:
    """Dated runs and this-machine figures live in docs/BENCHMARKS.md's results log."""
    text = (REPO / "README.md").read_text()
    dated = re.findall(r"\b20\d\d-\d\d-\d\d\b|this (?:session'?s? )?machine", text)
    assert not dated, f"README.md carries dated or machine-bound figures: {dated}"


def test_no_tracker_numbers_in_code_docs_or_tests() -> None:
    found = tracker_refs()
    assert not found, ("references to tracker entries by number; say what the thing is "
                       "instead:\n" + "\n".join(line for lines in found.values()
                                                  for line in lines))


def test_the_tracker_pattern_finds_what_it_should() -> None:
    word = "iss" + "ue"  # split, so that this file holds no reference itself
    assert TRACKER_REF.search(f"the controller ({word} 23) runs")
    assert TRACKER_REF.search(f"{word.title()} #12, finding 3")
    assert TRACKER_REF.search(f"({word}s 20 and 12)")
    assert not TRACKER_REF.search(f"an {word} with the node")


def test_the_test_budget_the_docs_state_is_the_one_make_test_prints() -> None:
    budget = re.search(r"\(budget (\d+) s\)", (REPO / "Makefile").read_text())
    assert budget is not None, "make test no longer prints its budget"
    minutes = int(budget.group(1)) // 60
    for doc in ("README.md", "docs/DEVELOPING.md"):
        text = " ".join((REPO / doc).read_text().split())
        assert f"budget of {minutes} minutes" in text or f"budget is {minutes} minutes" in text, doc
