"""Result rows for the history's tests: a passed one-device sim test unless told otherwise."""

from __future__ import annotations

from devpool.history.results import TestResult

T0 = 1_700_000_000.0


def result(nodeid: str, duration: float, at: float, run_id: str = "", **kw: object) -> TestResult:
    fields: dict[str, object] = {
        "outcome": "passed",
        "platform": "sim",
        "device_count": 1,
        "runner_class": "sim-8",
    }
    fields.update(kw)
    return TestResult(nodeid, duration=duration, time=at, run_id=run_id, **fields)  # type: ignore[arg-type]
