"""Figures every report form shares: totals, utilisation, the tests that did not pass."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from devpool.devices.inventory import format_ids
from devpool.outcomes import Outcome
from devpool.report.record import JobRun, RunRecord

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


@dataclass(frozen=True)
class RepeatRow:
    """One test under --devpool-repeat: how often it passed, and where it failed."""

    nodeid: str
    runs: int
    passed: int  # passed or flaky
    failed_on: tuple[tuple[str, int], ...]  # (devices, failures there), most failures first

    @property
    def rate(self) -> float:
        return self.passed / self.runs if self.runs else 0.0

    def line(self) -> str:
        """'3/5 passed (60%)  test_x  failed on: sim:1 ×2'."""
        text = f"{self.passed}/{self.runs} passed ({self.rate:.0%})  {self.nodeid}"
        if self.failed_on:
            text += "  failed on: " + ", ".join(f"{where} ×{n}" for where, n in self.failed_on)
        return text


def repeat_rows(results: Mapping[str, Iterable[tuple[str, str]]]) -> list[RepeatRow]:
    """Rows from each test's (outcome, devices) per repeat: the lowest pass rate first (the
    tests to look at), ties by node id, so two runs of one suite list alike."""
    rows = []
    for nodeid, runs in results.items():
        outcomes = list(runs)
        passed = sum(1 for outcome, _ in outcomes if outcome in ("passed", "flaky"))
        failures = Counter(where for outcome, where in outcomes if Outcome(outcome).gates)
        spread = tuple(sorted(failures.items(), key=lambda f: (-f[1], f[0])))
        rows.append(RepeatRow(nodeid, len(outcomes), passed, spread))
    rows.sort(key=lambda row: (row.rate, row.nodeid))
    return rows


def repeats(record: RunRecord) -> list[RepeatRow]:
    """The --devpool-repeat table of a recorded run; [] for a run without repeats."""
    if int(record.options.get("repeat") or 1) < 2:
        return []
    results: dict[str, list[tuple[str, str]]] = {}
    for job in record.finished_jobs():
        if job.retried or job.outcome is None:
            continue
        where = f"{record.platform}:{format_ids(job.devices)}" if job.devices else "cpu"
        results.setdefault(job.test_id, []).append((job.outcome, where))
    return repeat_rows(results)
