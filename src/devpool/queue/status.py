"""Where a queue run stands: its tests by state and outcome, its jobs, what is still queued.

`devpool queue status` prints it and the host page (serve/queue_view.py) shows it; both
render one RunStatus, counted here once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from devpool.outcomes import Outcome
from devpool.queue.classes import ClassFigures, Gap, figures, fits, gaps
from devpool.queue.rows import JobRow, TestRow
from devpool.wording import counted

SCHEMA = 1
STATES = ("done", "claimed", "queued", "deselected")
SHOWN_QUEUED = 20
_ORDER = {outcome.value: i for i, outcome in enumerate(Outcome)}


@dataclass(frozen=True)
class JobStatus:
    """One job that joined the run, and what it holds and ran."""

    job_id: int
    host: str
    pid: int
    devices: int
    platform: str
    state: str  # alive, lost (its lease ran out), left
    claimed: int
    done: int

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job_id,
            "host": self.host,
            "pid": self.pid,
            "devices": self.devices,
            "platform": self.platform,
            "state": self.state,
            "claimed": self.claimed,
            "done": self.done,
        }


@dataclass(frozen=True)
class QueuedStatus:
    """A test still queued: what it needs, and whether a live job of the run can hold it."""

    test_id: str
    request: str
    devices: int
    holdable: bool


@dataclass(frozen=True)
class RunStatus:
    """The run as the queue holds it, claims of jobs whose lease ran out counted as queued
    (where the next reap puts them)."""

    run_id: str
    states: dict[str, int]
    outcomes: dict[str, int]
    jobs: tuple[JobStatus, ...]
    queued: tuple[QueuedStatus, ...]  # those no live job can hold first, then in order
    largest_live: int | None  # devices of the largest live job; None when none is alive
    classes: tuple[ClassFigures, ...] = ()  # per platform of the jobs: jobs, tests, hours, wall
    gaps: tuple[Gap, ...] = ()  # tests no live job of their class can take, or deselected

    @property
    def tests(self) -> int:
        return sum(self.states.values())

    @property
    def unholdable(self) -> int:
        return sum(1 for test in self.queued if not test.holdable)

    @property
    def finished(self) -> bool:
        """Every test has its final outcome."""
        return self.states["done"] + self.states.get("deselected", 0) == self.tests

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run_id,
            "tests": self.tests,
            "states": dict(self.states),
            "outcomes": dict(self.outcomes),
            "finished": self.finished,
            "jobs": [job.to_json() for job in self.jobs],
            "largest_live_job": self.largest_live,
            "unholdable": self.unholdable,
            "queued": [
                {"test": t.test_id, "request": t.request, "holdable": t.holdable}
                for t in self.queued[:SHOWN_QUEUED]
            ],
            "classes": [c.to_json() for c in self.classes],
            "class_gaps": [{**g.to_json(), "sentence": g.sentence()} for g in self.gaps],
        }

    def lines(self) -> list[str]:
        """`devpool queue status`: the tests by state, the jobs, what is still queued."""
        done = self.states["done"]
        ended = ", ".join(f"{n} {outcome}" for outcome, n in self.outcomes.items())
        lines = [
            f"queue run {self.run_id!r}: {counted(self.tests, 'test')}: {done} done"
            + (f" ({ended})" if ended else "")
            + "".join(
                f", {self.states[state]} {state}" for state in STATES[1:] if state in self.states
            )
        ]
        for job in self.jobs:
            state = "lost its lease" if job.state == "lost" else job.state
            lines.append(
                f"  job {job.job_id}: {job.host} ({counted(job.devices, 'device')}), "
                f"pid {job.pid}, {state}, {job.claimed} claimed, {job.done} done"
            )
        lines += [f"  {c.line()}" for c in self.classes] if len(self.classes) > 1 else []
        lines += [f"  {gap.sentence()}" for gap in self.gaps]
        if self.queued:
            stuck = ""
            if self.unholdable:
                largest = (
                    "no job is alive"
                    if self.largest_live is None
                    else f"the largest has {counted(self.largest_live, 'device')}"
                )
                stuck = f", {self.unholdable} that no live job can hold ({largest})"
            lines.append(f"queued ({len(self.queued)}){stuck}:")
            for test in self.queued[:SHOWN_QUEUED]:
                mark = "" if test.holdable else ": no live job can hold it"
                lines.append(f"  {test.test_id} ({test.request}){mark}")
            if len(self.queued) > SHOWN_QUEUED:
                lines.append(f"  … and {len(self.queued) - SHOWN_QUEUED} more")
        return lines


def run_status(
    run_id: str, jobs: Sequence[JobRow], rows: Sequence[TestRow], lapsed: Collection[int] = ()
) -> RunStatus:
    """The run's status from the store's jobs and tests; `lapsed`: jobs whose lease ran out
    that no reap has marked lost yet (QueueStore.lapsed), shown as lost, their claims queued."""
    states: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    claimed: Counter[int] = Counter()
    waiting: list[TestRow] = []
    for row in rows:
        state = row.state
        if state == "claimed" and row.job_id in lapsed:
            state = "queued"
        states[state] += 1
        if state == "done":
            outcomes[row.outcome or "?"] += 1
        elif state == "claimed" and row.job_id is not None:
            claimed[row.job_id] += 1
        elif state != "deselected":
            waiting.append(row)
    live = [job.devices for job in jobs if job.alive]
    largest = max(live) if live else None
    alive = [job for job in jobs if job.alive]
    queued = [
        QueuedStatus(
            row.test_id,
            row.request,
            row.devices,
            any(
                j.devices >= row.devices and fits(row.platforms, j.platform, j.kind) for j in alive
            ),
        )
        for row in waiting
    ]
    queued.sort(key=lambda test: test.holdable)  # stable: collection order within each
    return RunStatus(
        run_id=run_id,
        # "deselected" only in a run that declared its classes (--devpool-queue-classes)
        states={s: states[s] for s in STATES if s != "deselected" or states[s]},
        outcomes=dict(sorted(outcomes.items(), key=lambda kv: (_ORDER.get(kv[0], 99), kv[0]))),
        jobs=tuple(_job(job, claimed[job.job_id], lapsed) for job in jobs),
        queued=tuple(queued),
        largest_live=largest,
        classes=tuple(figures(rows, jobs)),
        gaps=tuple(gaps(run_id, rows, jobs)),
    )


def _job(job: JobRow, claimed: int, lapsed: Collection[int]) -> JobStatus:
    state = "alive" if job.alive else "lost" if job.lost or job.job_id in lapsed else "left"
    return JobStatus(
        job.job_id, job.host, job.pid, job.devices, job.platform, state, claimed, job.done
    )
