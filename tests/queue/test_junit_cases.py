"""JUnitCases (queue/junit_cases.py): the failure texts and earlier attempts a job's claimed
tests carry into the queue's merged JUnit file."""

from __future__ import annotations

from typing import Any

import pytest

from devpool.queue.claims import Claim
from devpool.queue.junit_cases import JUnitCases


def _report(nodeid: str, outcome: str, longrepr: Any, when: str = "call") -> pytest.TestReport:
    return pytest.TestReport(nodeid, ("t.py", 0, nodeid), {}, outcome, longrepr, when)


def test_failure_and_skip_texts_are_noted_and_passes_are_not() -> None:
    cases = JUnitCases("h1")
    cases.note(_report("t.py::a", "passed", None))
    cases.note(_report("t.py::a", "failed", "AssertionError: one"))
    cases.note(_report("t.py::a", "failed", "boom in teardown", when="teardown"))
    cases.note(_report("t.py::b", "skipped", ("t.py", 3, "Skipped: no gpu"), when="setup"))
    assert cases.texts == {
        "t.py::a": ["AssertionError: one", "boom in teardown"],
        "t.py::b": [_report("t.py::b", "skipped", ("t.py", 3, "Skipped: no gpu")).longreprtext],
    }
    assert "no gpu" in cases.texts["t.py::b"][0]


def test_an_attempt_that_runs_again_names_its_number_host_devices_and_why() -> None:
    cases = JUnitCases("h1")
    cases.note(_report("t.py::a", "failed", "AssertionError: first"))
    fields = {"attempt": 1, "outcome": "failed", "devices": [2, 3], "tail": ["ignored"]}
    cases.ran_again("t.py::a", fields)
    assert cases.attempts("t.py::a") == [
        {
            "attempt": 1,
            "outcome": "failed",
            "message": "attempt 1 on h1 (devices 2,3): failed",
            "text": "AssertionError: first",  # what pytest showed, over the log's tail
            "host": "h1",
        }
    ]
    assert "t.py::a" not in cases.texts  # taken by the attempt: not the final one's text


def test_a_crash_with_no_report_keeps_its_tail_and_its_detail_on_cpu() -> None:
    cases = JUnitCases("h2")
    fields = {
        "attempt": 2,
        "outcome": "crashed",
        "detail": "worker died (SIGSEGV)",
        "devices": [],
        "tail": ["line one", "Segmentation fault"],
    }
    cases.ran_again("t.py::a", fields)
    (attempt,) = cases.attempts("t.py::a")
    assert attempt["message"] == "attempt 2 on h2 (devices cpu): worker died (SIGSEGV)"
    assert attempt["text"] == "line one\nSegmentation fault"
    assert attempt["outcome"] == "crashed"


def test_a_resumed_rerun_keeps_the_attempts_from_the_jobs_it_ran_on() -> None:
    cases = JUnitCases("here")
    earlier = {"attempt": 1, "outcome": "failed", "message": "m", "text": "t", "host": "there"}
    cases.resumed(Claim("t.py::a", token=7, estimate=1.0, attempt=2, earlier=(earlier,)))
    cases.ran_again("t.py::a", {"attempt": 2, "outcome": "timeout", "devices": [0]})
    assert [a["host"] for a in cases.attempts("t.py::a")] == ["there", "here"]
    assert cases.attempts("t.py::a")[0] == earlier
    assert cases.attempts("t.py::a")[0] is not earlier  # a copy: the claim's stays as it was


def test_fold_puts_text_and_earlier_attempts_into_the_result_once() -> None:
    cases = JUnitCases("h1")
    cases.note(_report("t.py::a", "failed", "first"))
    cases.ran_again("t.py::a", {"attempt": 1, "outcome": "failed", "devices": [0]})
    cases.note(_report("t.py::a", "failed", "second"))
    cases.note(_report("t.py::a", "failed", "second, teardown", when="teardown"))
    result: dict[str, Any] = {"outcome": "failed"}
    cases.fold("t.py::a", result)
    assert result["text"] == "second\nsecond, teardown"
    assert [a["text"] for a in result["earlier"]] == ["first"]
    assert cases.attempts("t.py::a") == [] and "t.py::a" not in cases.texts
    again: dict[str, Any] = {}
    cases.fold("t.py::a", again)
    assert again == {"text": "", "earlier": []}


def test_a_test_that_moves_away_is_forgotten_here() -> None:
    cases = JUnitCases("h1")
    cases.note(_report("t.py::a", "failed", "x"))
    cases.ran_again("t.py::a", {"attempt": 1, "outcome": "failed"})
    cases.note(_report("t.py::a", "failed", "y"))
    cases.note(_report("t.py::b", "failed", "z"))
    cases.forget("t.py::a")
    assert cases.attempts("t.py::a") == [] and "t.py::a" not in cases.texts
    assert cases.texts == {"t.py::b": ["z"]}
    cases.forget("t.py::never")  # nothing of it here: no error
