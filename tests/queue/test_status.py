"""queue/status.py: one run's status from the store's rows, without a database."""

from __future__ import annotations

from typing import Any

from devpool.queue import rows as queue
from devpool.queue.rows import JobRow
from devpool.queue.status import SHOWN_QUEUED, run_status


def row(position: int, devices: int, state: str = "queued", **more: object) -> queue.TestRow:
    fields: dict[str, Any] = {"outcome": None, "gating": False, "result": None, **more}
    test_id, request = f"t.py::test_{position}", f"{devices} devices"
    return queue.TestRow(position, test_id, devices, request, state, **fields)


def job(job_id: int, devices: int, alive: bool, lost: bool = False) -> JobRow:
    return JobRow(job_id, f"host-{job_id}", 100 + job_id, devices, "sim", alive, lost, 0, 0)


def test_a_lapsed_jobs_claims_count_as_queued_and_it_as_lost() -> None:
    rows = [
        row(0, 1, "done", outcome="passed", job_id=1),
        row(1, 2, "done", outcome="failed", job_id=1),
        row(2, 2, "done", outcome="passed", job_id=1),
        row(3, 4, "claimed", job_id=2),  # its job's lease ran out, unreaped
        row(4, 2, "claimed", job_id=3),
        row(5, 8),
    ]
    status = run_status("r", [job(1, 2, False), job(2, 4, False), job(3, 2, True)], rows, {2})
    assert status.states == {"done": 3, "claimed": 1, "queued": 2}
    assert status.outcomes == {"passed": 2, "failed": 1}  # in Outcome's order
    assert [(j.state, j.claimed) for j in status.jobs] == [("left", 0), ("lost", 0), ("alive", 1)]
    assert [(t.test_id, t.holdable) for t in status.queued] == [
        ("t.py::test_3", False),
        ("t.py::test_5", False),
    ]
    assert status.largest_live == 2 and not status.finished
    assert (
        status.lines()[0]
        == "queue run 'r': 6 tests: 3 done (2 passed, 1 failed), 1 claimed, 2 queued"
    )
    assert status.lines()[3] == "  job 3: host-3 (2 devices), pid 103, alive, 1 claimed, 0 done"


def test_what_no_live_job_holds_comes_first_and_the_list_is_capped() -> None:
    rows = [row(i, 1) for i in range(SHOWN_QUEUED + 5)] + [row(99, 4)]
    status = run_status("r", [job(1, 2, True)], rows)
    assert status.queued[0].test_id == "t.py::test_99" and status.unholdable == 1
    lines = status.lines()
    assert (
        lines[2]
        == f"queued ({SHOWN_QUEUED + 6}), 1 that no live job can hold (the largest has 2 devices):"
    )
    assert lines[3] == "  t.py::test_99 (4 devices): no live job can hold it"
    assert lines[-1] == "  … and 6 more"
    assert len(status.to_json()["queued"]) == SHOWN_QUEUED
    nobody = run_status("r", [job(1, 2, False, lost=True)], rows)
    assert nobody.unholdable == len(rows) and "(no job is alive)" in nobody.lines()[2]


def test_per_class_figures_and_what_no_job_of_a_class_took() -> None:
    ran = {"start": 100.0, "end": 136.0, "run_time": 36.0, "devices": [0, 1]}
    h100 = JobRow(1, "a", 11, 2, "h100", True, False, 0, 2, "sim")
    h200 = JobRow(2, "b", 12, 2, "h200", False, True, 0, 0, "sim")
    rows = [
        row(0, 2, "done", outcome="passed", job_id=1, result=ran, platforms="h100"),
        row(1, 1, "done", outcome="passed", job_id=1, result={**ran, "start": 130.0}),
        row(2, 1, platforms="h200"),  # its only job lost its lease
        row(3, 1, "deselected", platforms="b200"),
    ]
    status = run_status("r1", [h100, h200], rows)
    figures = [c.to_json() for c in status.classes]
    assert figures[0] == {
        "platform": "h100", "jobs": 1, "tests": 2, "device_hours": 0.04, "wall": 36.0
    }  # fmt: skip
    assert figures[1]["tests"] == 0 and status.finished is False
    assert [t.holdable for t in status.queued] == [False]  # no live h200 job
    assert [g.sentence() for g in status.gaps] == [
        "1 test for h200: the h200 runners of run r1 (job 2) left or lost their lease first",
        "1 test for b200: deselected: run r1 covers other classes only (--devpool-queue-classes)",
    ]
    assert status.states["deselected"] == 1
    assert "  h100: 1 job, 2 tests, 0.04 device-hours, wall 36.0 s" in status.lines()
    from devpool.serve.queue_page import queue_section

    view = {"database": "db:5432", "run": "r1", "answered": 1.0, "problem": None}
    page = queue_section({**view, "runs": [{**status.to_json(), "published": None}]}, 2.0)
    assert 'data-class="h200"' in page and "0.04</td>" in page
    assert '<p class="queue-gap bad">1 test for h200: the h200 runners' in page
    assert "1 deselected" in page
