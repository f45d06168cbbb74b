"""The one summary of a run that every report form renders (ARCHITECTURE: "One summary of a
run ... is computed once"): pytest's closing-line counts with the tests in each category, the
tests that were interrupted or did not run, the endings that did not pass, utilisation.

It is read from the run record, a file or the live one (report.record.LiveRecord), so the
terminal and `devpool report` cannot disagree. The counts are pytest's own: the record keeps,
for each attempt, the category pytest's terminal counted each of its reports in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from devpool.devices.inventory import format_ids
from devpool.outcomes import Outcome
from devpool.report.once import OnceRun, onces_of
from devpool.report.record import JobRun, LeakLine, RunRecord
from devpool.wording import counted

# pytest's own categories beside devpool's outcomes: a test that xfailed is no skip.
XFAILED, XPASSED, DESELECTED = "xfailed", "xpassed", "deselected"
# The closing line's order: pytest's known categories first (as its terminal orders them),
# then the others as they first came (devpool's own, in this order where that is unknown).
KNOWN = ["failed", "passed", "skipped", DESELECTED, XFAILED, XPASSED, "error"]
ORDER = KNOWN + [o.value for o in Outcome if o.value not in KNOWN] + ["quarantined", "rerun"]
NOT_RUN_SHOWN = 50  # tests named per category in text and Markdown; JSON names them all


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


# Categories every form names the tests of (JSON names every category's tests). A queue
# run's test of a platform class no job of it took is "not taken" (queue/classes.py).
INTERRUPTED, NOT_RUN, NOT_TAKEN = "interrupted", "not run", "not taken"
NAMED = (
    Outcome.FAILED.value,
    Outcome.ERROR.value,
    Outcome.TIMEOUT.value,
    Outcome.CRASHED.value,
    Outcome.INFRA.value,
    Outcome.FLAKY.value,
    "quarantined",
    INTERRUPTED,
    NOT_RUN,
    NOT_TAKEN,
)
_GATING = frozenset(o.value for o in Outcome if o.gates)


@dataclass(frozen=True)
class Ending:
    """The final attempt of a test that did not pass (or was flaky), with its earlier logs."""

    job: JobRun
    earlier: tuple[str, ...]  # the logs of its attempts that ran again, first to last

    @property
    def label(self) -> str:
        """'FAILED', or 'FAILED+ERROR' for a test pytest counts in two categories."""
        words = [c for c in (self.job.counted or []) if c in _GATING] or [self.job.outcome or "?"]
        return "+".join(dict.fromkeys(w.upper() for w in words))


@dataclass(frozen=True)
class ClassGap:
    """A queue run's tests of one platform class that did not run, and why: not taken (no
    job of the class: the run is not green), or deselected (the run covers other classes)."""

    sentence: str  # "8 tests for h200: no h200 runner joined run r1"
    tests: tuple[str, ...]
    deselected: bool = False


@dataclass(frozen=True)
class RunSummary:
    """One run, summed up once: every report form renders this and counts nothing itself."""

    run_id: str
    platform: str
    devices: tuple[int, ...]
    duration: float
    planned: int
    exitstatus: int | None
    finished: bool
    interrupted: bool
    damage: str | None
    # category → node ids: pytest's closing-line categories (a test once per report pytest
    # counted, in collection order), then "interrupted" and "not run"
    tests: Mapping[str, tuple[str, ...]]
    troubles: tuple[Ending, ...]  # gating endings, in collection order (as pytest's summary)
    flaky: tuple[Ending, ...]  # failed, then passed on a rerun
    quarantined: tuple[Ending, ...]  # failed but excused by the quarantine
    use: tuple[DeviceUse, ...]
    repeats: tuple[RepeatRow, ...]
    cut: str | None = None  # the sentence of a run that never ended
    # test → its final category (pytest's word where it has one: xfailed, xpassed), and
    # "interrupted" or "not run" for the planned tests without one
    outcomes: Mapping[str, str] = field(default_factory=dict)
    durations: Mapping[str, float] = field(default_factory=dict)  # test → its final test time
    deselected: int = 0  # tests the terminal's closing line counts as deselected
    appeared: tuple[str, ...] = ()  # the categories in the order the run first counted each
    # what tests left behind (`leak` lines, issue 52), in the order they were found
    leaks: tuple[LeakLine, ...] = ()
    leaks_checked: bool = False  # the run looked for leaks (--devpool-leaks warn or fail)
    gaps: tuple[ClassGap, ...] = ()  # a queue run's classes that did not run
    classes: tuple[str, ...] = ()  # a queue run's per-class figures, a line each
    onces: tuple[OnceRun, ...] = ()  # its once-fixtures (report/once.py)

    def leaked(self) -> tuple[str, ...]:
        """The tests charged with a leak, each once, in the order their first was found."""
        return tuple(dict.fromkeys(leak.nodeid for leak in self.leaks))

    def not_taken(self) -> list[ClassGap]:
        return [gap for gap in self.gaps if not gap.deselected]

    def counts(self) -> list[tuple[str, int]]:
        """(category, count) in the closing line's order, categories that no test is in left
        out; "deselected" as the terminal counted it."""
        order = [*KNOWN, *self.appeared, *ORDER]
        order += [*sorted(set(self.tests) - set(ORDER) - {INTERRUPTED, NOT_RUN})]
        order = list(dict.fromkeys([*order, INTERRUPTED, NOT_RUN]))
        found = {name: len(ids) for name, ids in self.tests.items() if ids}
        if self.deselected:
            found[DESELECTED] = self.deselected
        return [(name, found[name]) for name in order if name in found]

    def count(self, category: str) -> int:
        return len(self.tests.get(category, ()))

    def named(self) -> list[tuple[str, tuple[str, ...]]]:
        """The categories whose tests every form names, with their tests."""
        return [(name, self.tests[name]) for name in NAMED if self.tests.get(name)]

    def ended(self) -> int:
        """Tests that have a final outcome."""
        return self.planned - self.count(INTERRUPTED) - self.count(NOT_RUN)

    @property
    def verdict(self) -> str:
        """One line: how the run ended."""
        if self.cut is not None:
            return self.cut[0].upper() + self.cut[1:]
        bad = len(self.troubles)
        failing = ", ".join(f"{n} {name}" for name, n in self.counts() if name in _GATING)
        if self.interrupted:
            parts = [f"{self.ended()} of {counted(self.planned, 'test')} ran"]
            if bad:
                parts.append(f"{counted(bad, 'test')} did not pass ({failing})")
            cut = [f"{n} {name}" for name, n in self.counts() if name in (INTERRUPTED, NOT_RUN)]
            return f"interrupted (exit code {self.exitstatus}): " + ", ".join(parts + cut)
        missing = self.not_taken()
        gap = "; ".join(g.sentence for g in missing)
        if bad:
            also = f"; {gap}" if gap else ""
            status = f"(exit code {self.exitstatus})"
            return f"{counted(bad, 'test')} did not pass: {failing}{also} {status}"
        if missing:
            taken = counted(sum(len(g.tests) for g in missing), "test")
            return (
                f"{taken} not taken by a runner of their class: {gap} (exit code {self.exitstatus})"
            )
        return f"all tests passed (exit code {self.exitstatus})"


def summarize(record: RunRecord) -> RunSummary:
    """The one reading of a run record (a file, or the live one) that every form renders."""
    onces = onces_of(record.path)  # [tool.devpool.once]'s fixtures (report/once.py)
    tests: dict[str, list[str]] = {}
    finals: dict[str, JobRun] = {}
    earlier: dict[str, list[str]] = {}
    for job in record.finished_jobs():
        if not job.retried:
            finals[job.nodeid] = job
        elif job.log:
            earlier.setdefault(job.nodeid, []).append(job.log)
    # In collection order (a job's number is its place), as plain pytest ran and lists them.
    for job in sorted(record.finished_jobs(), key=lambda job: job.job):
        if job.counted is not None:
            categories = job.counted
        else:  # a record older than `counted`: its final attempts' own category alone
            categories = [job.shown or "running"] if finals.get(job.nodeid) is job else []
        for category in categories:
            tests.setdefault(category, []).append(job.nodeid)
    touched = {job.nodeid for job in record.jobs}
    interrupted = [n for n in dict.fromkeys(j.nodeid for j in record.jobs) if n not in finals]
    if interrupted:
        tests[INTERRUPTED] = interrupted
    planned = [str(nodeid) for nodeid in record.start.get("planned", [])]
    missing = [nodeid for nodeid in planned if nodeid not in touched]
    if not planned:  # an older record without its plan: a count, no names
        missing = ["?"] * max(0, record.total_tests - len(finals) - len(interrupted))
    gaps = tuple(
        ClassGap(str(g.get("sentence")), tuple(g.get("tests") or ()), bool(g.get("deselected")))
        for g in (record.end or {}).get("gaps") or ()
    )
    untaken = {nodeid for gap in gaps if not gap.deselected for nodeid in gap.tests}
    if untaken:
        tests[NOT_TAKEN] = [nodeid for nodeid in missing if nodeid in untaken]
        missing = [nodeid for nodeid in missing if nodeid not in untaken]
    if missing:
        tests[NOT_RUN] = missing

    def ending(job: JobRun) -> Ending:
        return Ending(job, tuple(earlier.get(job.nodeid, ())))

    ends = list(finals.values())
    ends.sort(key=lambda job: job.job)
    status = record.end.get("exitstatus") if record.end else None
    return RunSummary(
        run_id=str(record.start.get("run_id", "?")),
        platform=record.platform,
        devices=tuple(record.devices),
        duration=record.duration(),
        planned=max(record.total_tests, len(planned), len(finals) + len(interrupted)),
        exitstatus=int(status) if isinstance(status, int) else None,
        finished=record.finished,
        interrupted=record.interrupted,
        damage=record.damage,
        tests={name: tuple(ids) for name, ids in tests.items()},
        troubles=tuple(ending(job) for job in ends if job.gating),
        # pytest counted a flaky pass for these: named as flaky, whatever came after it (a
        # teardown error, or --devpool-flaky-result fail) is told among the troubles too
        flaky=tuple(
            ending(finals[nodeid])
            for nodeid in dict.fromkeys(tests.get(Outcome.FLAKY.value, ()))
            if nodeid in finals
        ),
        quarantined=tuple(
            ending(job)
            for job in ends
            if job.quarantined and job.outcome in _GATING and not job.gating
        ),
        use=tuple(device_use(record, onces)),
        onces=tuple(onces),
        repeats=tuple(repeats(record)),
        cut=record.cut_sentence(),
        outcomes={
            **{nodeid: NOT_RUN for nodeid in missing if nodeid != "?"},
            **{nodeid: NOT_TAKEN for nodeid in tests.get(NOT_TAKEN, ())},
            **{nodeid: INTERRUPTED for nodeid in interrupted},
            **{nodeid: job.shown or "?" for nodeid, job in finals.items()},
        },
        durations={nodeid: job.test_time for nodeid, job in finals.items()},
        deselected=int(record.start.get("deselected") or 0),
        gaps=gaps,
        classes=tuple(str(line) for line in (record.end or {}).get("classes") or ()),
        appeared=tuple(
            dict.fromkeys(
                category
                for job in sorted(record.finished_jobs(), key=lambda job: job.end or 0.0)
                for category in job.counted or ()
            )
        ),
        leaks=tuple(record.leaks),
        leaks_checked=record.leaks_checked,
    )


def where(platform: str, devices: Iterable[int]) -> str:
    """'sim:2,3' or 'cpu'."""
    ids = list(devices)
    return f"{platform}:{format_ids(ids)}" if ids else "cpu"


def name_lines(summary: RunSummary, shown: int = NOT_RUN_SHOWN) -> list[tuple[str, list[str]]]:
    """(heading, node ids) per named category for the text forms: 'flaky (1)', at most
    `shown` ids each, then '… and N more (see --format json)'."""
    out = []
    for name, ids in summary.named():
        listed = [nodeid for nodeid in ids[:shown] if nodeid != "?"]
        if len(ids) > shown:
            listed.append(f"… and {len(ids) - shown} more (see --format json)")
        out.append((f"{name} ({len(ids)})", listed))
    return out


def leak_lines(summary: RunSummary, shown: int = NOT_RUN_SHOWN) -> list[str]:
    """'test: pid 4242 `cmd` (sees sim:0; port 30001): terminated' per leak, at most `shown`,
    then '… and N more (see --format json)'."""
    lines = [leak.line() for leak in summary.leaks[:shown]]
    if len(summary.leaks) > shown:
        lines.append(f"… and {len(summary.leaks) - shown} more (see --format json)")
    return lines


def device_use(record: RunRecord, onces: Iterable[OnceRun] = ()) -> list[DeviceUse]:
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
    for once in onces:  # a once-fixture's lease: held, and no test's
        for device in once.devices:
            busy[device] = busy.get(device, 0.0) + once.held(record.last_time)
    return [DeviceUse(d, busy[d], jobs[d], tested.get(d, 0.0)) for d in sorted(busy)]


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
