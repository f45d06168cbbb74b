"""The one verdict of a run spread over many jobs: its record, read from the queue.

The queue holds each test's one final ending (the job_end its job recorded); laid out as a
run record, every form `devpool report` renders (text, Markdown, JSON, the GitHub step
summary) renders it, and the JUnit file has each test once, in collection order.
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devpool.queue.classes import NOT_COVERED, Gap, figures, gaps
from devpool.queue.rows import JobRow, TestRow
from devpool.queue.store import QueueStore
from devpool.report.junit import EarlierAttempt, add_attempt
from devpool.report.record import RunRecord, apply_event
from devpool.wording import counted

INTERRUPTED = 2  # pytest's exit codes
TESTS_FAILED = 1
NO_TESTS = 5
POLL = 1.0  # seconds between looks at a run that is still going


@dataclass(frozen=True)
class Verdict:
    """The queue's run as the report tells it."""

    record: RunRecord
    exitstatus: int
    jobs: tuple[JobRow, ...]
    rows: tuple[TestRow, ...]
    gaps: tuple[Gap, ...] = ()  # classes no job took, or the run left out on purpose


def wait_for_end(store: QueueStore, wait: float) -> list[TestRow]:
    """The run's tests once every one has ended, or no live job can take what remains (those
    end unsatisfiable), or `wait` seconds have passed."""
    deadline = time.monotonic() + wait
    while True:
        store.settle()
        if not store.remaining() or time.monotonic() >= deadline:
            return store.tests()  # the whole rows (outcomes, logs' tails) once, at the end
        time.sleep(min(POLL, max(0.0, deadline - time.monotonic())))


def outcome_of(
    run_id: str, rows: Sequence[TestRow], jobs: Sequence[JobRow], declared: Sequence[str] = ()
) -> Verdict:
    """The run record the queue's rows make, and pytest's exit status for them: NOT_COVERED
    when all that ran passed but tests of a class no job of it took did not run."""
    missing = gaps(run_id, rows, jobs, declared)
    untaken = {test for gap in missing if not gap.deselected for test in gap.tests}
    record = RunRecord(Path(f"queue:{run_id}"))
    # Each job's devices get numbers of their own across the run, in the order jobs joined.
    offsets: dict[int, int] = {}
    for job in jobs:
        offsets[job.job_id] = sum(j.devices for j in jobs if j.job_id < job.job_id)
    ended = [row for row in rows if row.state == "done"]
    times = [_end(row) for row in ended]
    begin = min([_start(row) for row in ended] or [time.time()])
    apply_event(
        record,
        {},
        {
            "type": "session_start",
            "time": begin,
            "run_id": run_id,
            "platform": next((job.platform for job in jobs), "?"),
            "devices": list(range(sum(job.devices for job in jobs))),
            "tests": len(rows) - sum(1 for row in rows if row.state == "deselected"),
            "planned": [row.test_id for row in rows if row.state != "deselected"],
            "deselected": sum(1 for row in rows if row.state == "deselected"),
            "host": ", ".join(job.describe() for job in jobs),
        },
    )
    for row in sorted(ended, key=_end):
        apply_event(record, {}, _job_end(row, offsets.get(row.job_id or 0, 0)))
    apart = sum(1 for row in rows if row.state == "deselected" or row.test_id in untaken)
    finished = len(ended) + apart == len(rows)
    status = INTERRUPTED
    if finished:
        status = TESTS_FAILED if any(row.gating for row in rows) else 0
        status = NOT_COVERED if untaken and not status else status
        status = status if len(rows) > apart or untaken else NO_TESTS
    end = {"type": "session_end", "time": max(times or [begin]), "exitstatus": status}
    end["gaps"] = [{**gap.to_json(), "sentence": gap.sentence()} for gap in missing]
    end["classes"] = [f.line() for f in figures(rows, jobs)] if len(jobs) else []
    if finished:
        apply_event(record, {}, end)
    return Verdict(record, status, tuple(jobs), tuple(rows), tuple(missing))


def _result(row: TestRow) -> Mapping[str, Any]:
    return row.result or {}


def _end(row: TestRow) -> float:
    return float(_result(row).get("end") or 0.0)


def _start(row: TestRow) -> float:
    result = _result(row)
    return float(result.get("start") or result.get("end") or time.time())


def _job_end(row: TestRow, offset: int) -> dict[str, Any]:
    """The test's ending as its job recorded it (the queue's own for an unsatisfiable one),
    its devices numbered across the run."""
    event = {k: v for k, v in _result(row).items() if k != "text"}
    event["devices"] = [offset + int(d) for d in event.get("devices") or ()]
    event.update(type="job_end", job=row.position, nodeid=row.test_id, outcome=row.outcome)
    event.setdefault("gating", row.gating)
    event.setdefault("time", time.time())
    event.setdefault("end", event["time"])
    event["retried"] = False
    return event


def jobs_line(jobs: Sequence[JobRow]) -> str:
    """'queue: 3 jobs joined: a (2 devices) ran 10, b (8 devices) ran 5, lost'."""
    parts = [
        f"{job.describe()} ran {job.done}" + (", lost its lease" if job.lost else "")
        for job in jobs
    ]
    return f"queue: {counted(len(jobs), 'job')} joined: " + ("; ".join(parts) or "none")


def _attempt(fields: Mapping[str, Any]) -> EarlierAttempt:
    """An earlier attempt as the queue keeps it (queue/source.py), as JUnit folds it."""
    return EarlierAttempt(
        int(fields.get("attempt") or 1),
        str(fields.get("outcome") or "failed"),
        str(fields.get("message") or ""),
        str(fields.get("text") or ""),
    )


def write_junit(path: Path, verdict: Verdict) -> None:
    """One JUnit file as pytest writes one: each test once, in collection order."""
    from _pytest.junitxml import mangle_test_address

    record = verdict.record
    finals = {job.nodeid: job for job in record.final_attempts()}
    texts = {row.test_id: str(_result(row).get("text") or "") for row in verdict.rows}
    untaken = {t: g.sentence() for g in verdict.gaps if not g.deselected for t in g.tests}
    rows = [row for row in verdict.rows if row.state != "deselected"]  # as pytest's file
    suite = ET.Element("testsuite", name="pytest")
    counts = {"errors": 0, "failures": 0, "skipped": 0}
    total = 0.0
    for row in rows:
        names = mangle_test_address(row.test_id)
        job = finals.get(row.test_id)
        seconds = job.test_time if job is not None else 0.0
        total += seconds
        case = ET.SubElement(
            suite,
            "testcase",
            classname=".".join(names[:-1]),
            name=names[-1],
            time=f"{seconds:.3f}",
        )
        shown = job.shown if job is not None else "not run"
        passed = shown in ("passed", "flaky", "xpassed", "skipped", "xfailed")
        for attempt in _result(row).get("earlier") or ():  # the attempts that ran again
            add_attempt(case, _attempt(attempt), passed)
        message = job.detail if job is not None else "the run ended before this test did"
        message = f"not taken: {untaken[row.test_id]}" if row.test_id in untaken else message
        text = texts.get(row.test_id) or "\n".join(job.tail if job is not None else [])
        if shown in ("skipped", "xfailed"):
            counts["skipped"] += 1
            kind = "pytest.xfail" if shown == "xfailed" else "pytest.skip"
            ET.SubElement(case, "skipped", type=kind, message=message[:500]).text = text
        elif shown == "error":
            counts["errors"] += 1
            ET.SubElement(case, "error", message=message[:500]).text = text
        elif shown not in ("passed", "flaky", "xpassed"):
            counts["failures"] += 1
            said = message if shown == "failed" else f"{shown}: {message}"
            ET.SubElement(case, "failure", message=said[:500]).text = text
    suite.set("errors", str(counts["errors"]))
    suite.set("failures", str(counts["failures"]))
    suite.set("skipped", str(counts["skipped"]))
    suite.set("tests", str(len(rows)))
    suite.set("time", f"{total:.3f}")
    root = ET.Element("testsuites", name="pytest tests")
    root.append(suite)
    body = ET.tostring(root, encoding="unicode")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('<?xml version="1.0" encoding="utf-8"?>' + body, encoding="utf-8")
