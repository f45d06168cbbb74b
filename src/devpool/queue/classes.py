"""Hardware classes in one queue run (issue 56): which jobs may claim a test, what no job took.

A test's class is its platforms filter (`platforms([...])`, `platforms` in [tool.devpool.paths]
and in marker aliases): the platform names or kinds it runs on, none for any. The run holds
every collected test whichever job publishes it; a job claims only tests its platform (name
or kind) matches. Tests whose class no live job of the run has are not taken: the verdict
names them by class and is not green. `--devpool-queue-classes` declares a run that covers
some classes on purpose: the others' tests are deselected, with the reason.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from devpool.errors import DevpoolError
from devpool.wording import counted

# A job (alias {j}, with platform and kind) that may claim test t: the test names no class,
# or names the job's platform or its kind.
FITS = "(t.platforms = '' OR string_to_array(t.platforms, ',') && ARRAY[{j}.platform, {j}.kind])"
NOT_COVERED = 6  # `devpool queue report`: the tests that ran passed, a class was not taken


def class_of(platforms: Iterable[str] | None) -> str:
    """The stored form of a platforms filter: its names sorted, comma-joined; '' for any."""
    return ",".join(sorted(set(platforms))) if platforms is not None else ""


def label(platforms: str) -> str:
    """'h200', or 'h100 or h200' for a test that runs on either."""
    return " or ".join(platforms.split(",")) if platforms else "any platform"


def fits(platforms: str, name: str, kind: str) -> bool:
    """Whether a job of this platform may claim a test of this class."""
    return not platforms or bool({name, kind} & set(platforms.split(",")))


def covered(platforms: str, declared: Collection[str]) -> bool:
    """Whether a run declared to cover `declared` (names, with their kinds) covers a test."""
    return not declared or not platforms or bool(set(declared) & set(platforms.split(",")))


def widen(declared: Sequence[str], kinds: Mapping[str, str]) -> tuple[str, ...]:
    """The declared classes with the kinds of the known ones: a test for `sim` is covered by
    a run that declares h100 when h100 is a sim platform."""
    return tuple(dict.fromkeys([*declared, *(kinds[n] for n in declared if n in kinds)]))


def unused(declared: Sequence[str], classes: Iterable[str], here: Collection[str]) -> list[str]:
    """Declared classes no test's filter names and this job does not run as: a warning."""
    named = {name for platforms in classes for name in platforms.split(",") if name}
    return [name for name in declared if name not in named and name not in here]


class _Job(Protocol):
    @property
    def job_id(self) -> int: ...
    @property
    def host(self) -> str: ...
    @property
    def platform(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def alive(self) -> bool: ...


class _Row(Protocol):
    @property
    def test_id(self) -> str: ...
    @property
    def platforms(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def job_id(self) -> int | None: ...
    @property
    def result(self) -> Mapping[str, Any] | None: ...


def kind_conflict(jobs: Sequence[_Job], platform: str, kind: str, me: str) -> None:
    """One sentence when another job of the run runs `platform` as another kind."""
    for job in jobs:
        if job.platform == platform and job.kind and job.kind != kind:
            raise DevpoolError(
                f"queue: job {job.job_id} on {job.host} runs platform {platform!r} as kind "
                f"{job.kind!r}, this job ({me}) as kind {kind!r}: one platform name must mean "
                "one kind in a run (name each device model once under [tool.devpool.platforms])"
            )


@dataclass(frozen=True)
class Gap:
    """Tests of one class the run did not run: not taken (no job of the class), or
    deselected (the run declared it covers other classes)."""

    platforms: str
    tests: tuple[str, ...]
    why: str
    deselected: bool = False

    def sentence(self) -> str:
        """'8 tests for h200: no h200 runner joined run r1'."""
        return f"{counted(len(self.tests), 'test')} for {label(self.platforms)}: {self.why}"

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.platforms,
            "tests": list(self.tests),
            "why": self.why,
            "deselected": self.deselected,
        }


def gaps(
    run_id: str, rows: Sequence[_Row], jobs: Sequence[_Job], declared: Sequence[str] = ()
) -> list[Gap]:
    """The tests no live job of their class can take, grouped by class, and those the run's
    declared classes leave out (deselected)."""
    waiting: dict[str, list[str]] = {}
    dropped: dict[str, list[str]] = {}
    live = [job for job in jobs if job.alive]
    for row in rows:
        if row.state == "deselected":
            dropped.setdefault(row.platforms, []).append(row.test_id)
        elif (
            row.state == "queued"
            and row.platforms
            and not any(fits(row.platforms, j.platform, j.kind) for j in live)
        ):
            waiting.setdefault(row.platforms, []).append(row.test_id)
    found = []
    for platforms, tests in waiting.items():
        ever = [j for j in jobs if fits(platforms, j.platform, j.kind)]
        runner = f"{label(platforms)} runner"
        if not ever:
            why = f"no {runner} joined run {run_id}"
        else:
            ids = ", ".join(str(j.job_id) for j in ever)
            why = f"the {runner}s of run {run_id} (job {ids}) left or lost their lease first"
        found.append(Gap(platforms, tuple(tests), why))
    for platforms, tests in dropped.items():
        why = f"deselected: run {run_id} covers {', '.join(declared) or 'other classes'} only"
        found.append(Gap(platforms, tuple(tests), why + " (--devpool-queue-classes)", True))
    return found


@dataclass(frozen=True)
class ClassFigures:
    """One platform's jobs in the run: how many, the tests they ran, device-hours, wall."""

    platform: str
    jobs: int
    tests: int
    device_hours: float
    wall: float  # seconds from the first test's start to the last test's end on it

    def line(self) -> str:
        return (
            f"{self.platform}: {counted(self.jobs, 'job')}, {counted(self.tests, 'test')}, "
            f"{self.device_hours:.2f} device-hours, wall {self.wall:.1f} s"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "jobs": self.jobs,
            "tests": self.tests,
            "device_hours": round(self.device_hours, 4),
            "wall": round(self.wall, 3),
        }


def figures(rows: Sequence[_Row], jobs: Sequence[_Job]) -> list[ClassFigures]:
    """Per platform of the jobs that joined (in the order they first joined): its figures
    from the tests its jobs ran."""
    platform_of = {job.job_id: job.platform for job in jobs}
    names = list(dict.fromkeys(job.platform for job in jobs))
    tests = dict.fromkeys(names, 0)
    busy = dict.fromkeys(names, 0.0)
    spans: dict[str, list[float]] = {name: [] for name in names}
    for row in rows:
        name = platform_of.get(row.job_id or -1)
        if row.state != "done" or name is None:
            continue
        result = row.result or {}
        tests[name] += 1
        start, end = result.get("start"), result.get("end")
        ran = float(result.get("run_time") or 0.0)
        busy[name] += ran * len(result.get("devices") or ())
        spans[name] += [float(t) for t in (start, end) if t]
    return [
        ClassFigures(
            name,
            sum(1 for job in jobs if job.platform == name),
            tests[name],
            busy[name] / 3600,
            max(spans[name]) - min(spans[name]) if spans[name] else 0.0,
        )
        for name in names
    ]
