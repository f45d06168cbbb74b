"""What a test's phase reports come to: its outcome as pytest's summary counts it, the first
line of its failure, pytest's own category, and the report text of an ending pytest did
not see (a timeout, a crash)."""

from __future__ import annotations

from typing import Any

import pytest

from devpool.outcomes import RERUN, Outcome


class Reason:
    """Where and why an ending devpool saw happened: pytest's reprcrash, for the one-line views
    (the short test summary, --tb=line, the JUnit failure message)."""

    def __init__(self, path: str, lineno: int, message: str) -> None:
        self.path = path
        self.lineno = lineno
        self.message = message

    def __str__(self) -> str:
        return f"{self.path}:{self.lineno}: {self.message}"


class UnseenEnding:
    """The failure text of an ending pytest could not see (a timeout, a crash, infra).

    pytest shows it as any failure: the whole text under FAILURES and in JUnit, and its
    reason alone in the short test summary (`CRASHED test_x.py::test_a - worker pid ...`).
    """

    def __init__(self, text: str, reason: str, location: tuple[str, int | None, str]) -> None:
        self.text = text
        self.reprcrash = Reason(location[0], (location[1] or 0) + 1, reason)

    def toterminal(self, tw: Any) -> None:
        for line in self.text.splitlines():
            tw.line(line)

    def __str__(self) -> str:
        return self.text


def is_subtest(report: pytest.TestReport) -> bool:
    """A subtest's report (pytest's subtests): its pass says nothing of the test's."""
    return getattr(report, "context", None) is not None and hasattr(report, "head_line")


def cause_of(reports: list[pytest.TestReport]) -> str:
    """The first line of a test's first failure (`assert 1 == 2`), for the summary."""
    for report in reports:
        failed = report.failed or getattr(report, "devpool_outcome", None) == RERUN
        if not failed or report.longrepr is None:
            continue
        crash = getattr(report.longrepr, "reprcrash", None)
        message = str(crash.message) if crash is not None else str(report.longrepr)
        lines = message.strip().splitlines()
        return lines[0] if lines else ""
    return ""


def category_of(phases: list[pytest.TestReport], outcome: Outcome) -> dict[str, str]:
    """pytest's own category where it is not the outcome: an xfail is skipped to devpool's
    closed set of outcomes, and a non-strict xpass passed, but pytest counts both apart."""
    if not any(
        hasattr(r, "wasxfail") and not getattr(r, "devpool_quarantined", False) for r in phases
    ):
        return {}
    if outcome is Outcome.SKIPPED:
        return {"category": "xfailed"}
    if outcome is Outcome.PASSED:
        return {"category": "xpassed"}
    return {}


def outcome_of(phases: list[pytest.TestReport]) -> Outcome:
    """A finished test's outcome from its phase reports, as pytest's own summary would count it."""
    flaky = any(getattr(r, "devpool_outcome", None) == Outcome.FLAKY for r in phases)
    # A failure after the flaky pass (its teardown) is the test's ending, as pytest counts it.
    failed = [
        r
        for r in phases
        if (r.failed and getattr(r, "devpool_outcome", None) != Outcome.FLAKY)
        or getattr(r, "devpool_outcome", None) == RERUN
        or getattr(r, "devpool_quarantined", False)
    ]
    if failed and not (flaky and all(r.when == "call" for r in failed)):
        return Outcome.FAILED if any(r.when == "call" for r in failed) else Outcome.ERROR
    if flaky:
        return Outcome.FLAKY
    if any(r.skipped for r in phases):
        return Outcome.SKIPPED
    return Outcome.PASSED
