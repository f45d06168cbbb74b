"""Figures every report form shares: totals, utilisation, the tests that did not pass."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from devpool.devices.inventory import format_ids
from devpool.outcomes import Outcome
from devpool.report.record import JobRun, RunRecord
from devpool.wording import counted

# pytest's own categories beside devpool's outcomes: a test that xfailed is no skip.
XFAILED, XPASSED = "xfailed", "xpassed"
ORDER = [o.value for o in Outcome] + [XFAILED, XPASSED]
NOT_RUN_SHOWN = 50  # not-run tests named in text and Markdown; JSON names them all


@dataclass(frozen=True)
class DeviceUse:
    """One device over the run: how long leases held it, and how much of that tests ran."""

    device: int
    busy: float  # seconds some job held its lease (worker start-up included)
    jobs: int
    tested: float = 0.0  # seconds tests ran on it (their own time, no start-up)

    def share(self, duration: float) -> float:
        """Lease-held share of the run."""
        return self.busy / duration if duration > 0 else 0.0

    def test_share(self, duration: float) -> float:
        """Share of the run its tests ran."""
        return self.tested / duration if duration > 0 else 0.0

    def line(self, platform: str, duration: float) -> str:
        """'sim:0 leased 90%, tests 2%'."""
        return (
            f"{platform}:{self.device} leased {self.share(duration):.0%}, "
            f"tests {self.test_share(duration):.0%}"
        )


def totals(record: RunRecord) -> list[tuple[str, int]]:
    """(outcome, tests) in the closed order of outcomes, plus 'not run' for a cut run."""
    counts = record.counts()
    rows = [(name, counts[name]) for name in ORDER if counts.get(name)]
    missing = record.total_tests - sum(counts.values())
    if missing > 0:
        rows.append(("not run", missing))
    return rows


def not_run_lines(record: RunRecord, shown: int = NOT_RUN_SHOWN) -> list[str]:
    """'not run: 3' then the first `shown` node ids of tests that did not run, for text forms."""
    missing = record.not_run()
    if not missing:
        return []
    lines = [f"not run ({len(missing)}):", *missing[:shown]]
    if len(missing) > shown:
        lines.append(f"… and {len(missing) - shown} more (see --format json)")
    return lines


def troubles(record: RunRecord) -> list[JobRun]:
    """The final attempt of every test that did not pass, in the order they ended."""
    return [job for job in record.final_attempts() if job.gating]


def device_use(record: RunRecord) -> list[DeviceUse]:
    """Per device: lease-held seconds and the tests' own seconds, apart."""
    busy: dict[int, float] = {d: 0.0 for d in record.devices}
    tested: dict[int, float] = {d: 0.0 for d in record.devices}
    jobs: dict[int, int] = {d: 0 for d in record.devices}
    for job in record.jobs:
        end = job.end if job.end is not None else record.last_time
        held = max(0.0, end - job.start) if job.start is not None else 0.0
        for device in job.devices:
            busy[device] = busy.get(device, 0.0) + held
            tested[device] = tested.get(device, 0.0) + min(job.test_time, held)
            jobs[device] = jobs.get(device, 0) + 1
    return [DeviceUse(d, busy[d], jobs[d], tested.get(d, 0.0)) for d in sorted(busy)]


def verdict(record: RunRecord) -> str:
    """One line: how the run ended."""
    cut = record.cut_sentence()
    if cut is not None:
        return cut.capitalize()
    status = record.end.get("exitstatus") if record.end else None
    bad = len(troubles(record))
    if record.interrupted:
        ran = len(record.final_attempts())
        failing = f", {counted(bad, 'test')} did not pass" if bad else ""
        return (
            f"interrupted (exit code {status}): {ran} of {counted(record.total_tests, 'test')} "
            f"ran{failing}"
        )
    if bad:
        return f"{counted(bad, 'test')} did not pass (exit code {status})"
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
