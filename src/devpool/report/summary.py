"""Figures every report form shares: totals, utilisation, the tests that did not pass."""

from __future__ import annotations

from dataclasses import dataclass

from devpool.outcomes import Outcome
from devpool.record import JobRun, RunRecord

ORDER = [o.value for o in Outcome]


@dataclass(frozen=True)
class DeviceUse:
    device: int
    busy: float  # seconds some job held it
    jobs: int

    def share(self, duration: float) -> float:
        return self.busy / duration if duration > 0 else 0.0


def totals(record: RunRecord) -> list[tuple[str, int]]:
    """(outcome, tests) in the closed order of outcomes, plus 'not run' for a cut run."""
    counts = record.counts()
    rows = [(name, counts[name]) for name in ORDER if counts.get(name)]
    missing = record.total_tests - sum(counts.values())
    if missing > 0:
        rows.append(("not run", missing))
    return rows


def troubles(record: RunRecord) -> list[JobRun]:
    """The final attempt of every test that did not pass, in the order they ended."""
    return [job for job in record.final_attempts() if job.gating]


def device_use(record: RunRecord) -> list[DeviceUse]:
    busy: dict[int, float] = {d: 0.0 for d in record.devices}
    jobs: dict[int, int] = {d: 0 for d in record.devices}
    for job in record.jobs:
        end = job.end if job.end is not None else record.last_time
        held = max(0.0, end - job.start) if job.start is not None else 0.0
        for device in job.devices:
            busy[device] = busy.get(device, 0.0) + held
            jobs[device] = jobs.get(device, 0) + 1
    return [DeviceUse(d, busy[d], jobs[d]) for d in sorted(busy)]


def verdict(record: RunRecord) -> str:
    """One line: how the run ended."""
    cut = record.cut_sentence()
    if cut is not None:
        return cut.capitalize()
    status = record.end.get("exitstatus") if record.end else None
    bad = len(troubles(record))
    if bad:
        return f"{bad} test{'s' if bad != 1 else ''} did not pass (exit code {status})"
    return f"all tests passed (exit code {status})"
