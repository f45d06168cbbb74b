"""What a job's claimed tests give the queue's merged JUnit file beyond their record events:
the failure text pytest showed, and the attempts that ran again (verdict.py folds them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from devpool.queue.claims import Claim


class JUnitCases:
    """The JUnit case material of this job's claimed tests, by display id, until each test's
    final outcome carries it to the queue."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.texts: dict[str, list[str]] = {}  # display id → failure text, for the JUnit file
        # display id → its attempts that ran again (here, or on the jobs it moved from), as the
        # final report folds them into the test's JUnit case
        self.earlier: dict[str, list[dict[str, Any]]] = {}

    def note(self, report: pytest.TestReport) -> None:
        """The failure or skip text pytest shows, for the merged JUnit file."""
        if report.failed or report.skipped:
            self.texts.setdefault(report.nodeid, []).append(report.longreprtext)

    def resumed(self, claim: Claim) -> None:
        """A rerun moved here: its attempts so far, from the jobs it ran on."""
        self.earlier[claim.test_id] = [dict(attempt) for attempt in claim.earlier]

    def ran_again(self, test: str, fields: Mapping[str, Any]) -> None:
        """An attempt of `test` that runs again (here or moved), from its job_end's fields."""
        number, detail = fields.get("attempt"), fields.get("detail") or fields.get("outcome")
        devices = ",".join(str(d) for d in fields.get("devices") or ()) or "cpu"
        self.earlier.setdefault(test, []).append(
            {
                "attempt": number,
                "outcome": str(fields.get("outcome")),
                "message": f"attempt {number} on {self.host} (devices {devices}): {detail}",
                "text": "\n".join(self.texts.pop(test, []) or fields.get("tail") or ()),
                "host": self.host,
            }
        )

    def attempts(self, test: str) -> list[dict[str, Any]]:
        """The attempts of `test` that ran again so far."""
        return self.earlier.get(test, [])

    def forget(self, test: str) -> None:
        """`test` went to another job, with its attempts so far."""
        self.earlier.pop(test, None)
        self.texts.pop(test, None)

    def fold(self, test: str, result: dict[str, Any]) -> None:
        """Put the text and earlier attempts of `test` into its final result, done with them."""
        result["text"] = "\n".join(self.texts.pop(test, []))
        result["earlier"] = self.earlier.pop(test, [])
