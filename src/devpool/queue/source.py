"""A job's side of the queue: feeds the tests it claims to its scheduler, reports their endings.

The run loop asks `more()` each turn: when what this job holds runs low it claims the next
batch (sized from the estimates) and hands the planned jobs of those tests to the scheduler.
Each test's one final ending (the record's job_end that is not retried) goes back to the
queue in batches, under the claim's fencing token.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import pytest

from devpool.config import Settings
from devpool.database import check_url, where
from devpool.devices.inventory import Inventory
from devpool.errors import DevpoolError
from devpool.plan.jobs import Job, Plan
from devpool.queue.claims import Claim
from devpool.queue.classes import class_of, fits, unused, widen
from devpool.queue.heartbeat import Heartbeat
from devpool.queue.junit_cases import JUnitCases
from devpool.queue.link import QueueLink
from devpool.queue.store import QueuedTest, QueueStore
from devpool.wording import counted

LOW_SECONDS = 2.0  # claim more when what this job holds falls under this much work per slot
BATCH_SECONDS = 4.0  # ... up to this much work per slot
POLL = 0.2  # seconds between looks at the queue while nothing is left to claim
FLUSH = 0.5  # seconds a final outcome may wait to be reported with others
FLUSH_AT = 100  # outcomes that are reported at once, whatever the time
T = TypeVar("T")


def run_id_from(given: str | None, environ: Mapping[str, str]) -> str:
    """--devpool-queue-run, else $GITHUB_RUN_ID-$GITHUB_RUN_ATTEMPT; one sentence without."""
    if given:
        return given
    run, attempt = environ.get("GITHUB_RUN_ID"), environ.get("GITHUB_RUN_ATTEMPT")
    if run and attempt:
        return f"{run}-{attempt}"
    raise DevpoolError(
        "--devpool-queue needs --devpool-queue-run=ID (the same in every job of the run); "
        "it defaults to $GITHUB_RUN_ID-$GITHUB_RUN_ATTEMPT only on GitHub Actions"
    )


def join_queue(
    settings: Settings,
    plan: Plan,
    inventory: Inventory,
    host: str,
    slots: int,
    asked: Mapping[str, int],
    classes: Mapping[str, Sequence[str]] = {},  # noqa: B006 - read only
    estimate_of: Callable[[str, Sequence[str]], float] | None = None,
) -> QueueSource:
    """This job on the queue of --devpool-queue: the run's tests published (or checked against
    those published), its lease held; DevpoolError in one sentence when it cannot be.

    asked: the devices each collected test asks for, also where this host skips it for lack
    of them (plan/skips.py plans those as CPU tests here) or its platform deselects it: the
    run's tests are the same everywhere. classes: each test's platforms filter, where it has
    one; estimate_of: the estimate of a test this platform deselects, from its class's
    durations first."""
    assert settings.queue is not None
    if settings.shard is not None:
        raise DevpoolError(
            "--devpool-queue and --devpool-shard both split the suite across jobs; give one "
            "(the queue gives each job what its devices can hold as it goes)"
        )
    url = check_url(settings.queue)
    run_id = run_id_from(settings.queue_run, os.environ)
    every = [*plan.jobs, *(job for job, _ in plan.unsatisfiable)]
    tests = published_tests(every, asked, classes, estimate_of or (lambda _t, _p: 1.0))
    platform = inventory.platform
    declared = widen(settings.queue_classes, {n: p.kind for n, p in settings.platforms.items()})
    source = QueueSource(
        url,
        run_id,
        tests,
        plan.jobs,
        len(inventory.devices),
        slots,
        settings.queue_lease,
        host,
        (platform.name, platform.kind),
        declared,
    )
    what = "published its" if source.published else "joined it, same"
    source.joined = (
        f"queue run {run_id!r} at {where(url)}: this job {what} "
        f"{counted(len(tests), 'test')}; job {source.job_id} ({platform.name}) claims what "
        f"{counted(len(inventory.devices), 'device')} can hold"
    )
    left_out = unused(settings.queue_classes, classes_of(tests), (platform.name, platform.kind))
    if left_out:
        source.notes.append(
            f"WARNING: --devpool-queue-classes names {', '.join(left_out)}, which no test's "
            "platforms filter names and this job does not run as: it covers nothing"
        )
    return source


def classes_of(tests: Sequence[QueuedTest]) -> set[str]:
    return {t.platforms for t in tests if t.platforms}


def published_tests(
    jobs: Sequence[Job],
    asked: Mapping[str, int],
    classes: Mapping[str, Sequence[str]],
    estimate_of: Callable[[str, Sequence[str]], float],
) -> list[QueuedTest]:
    """Every collected test as the run holds it, in collection order: this job's planned
    ones, and those its platform deselects (another class's, claimed by that class's jobs)."""
    order = {nodeid: i for i, nodeid in enumerate(asked)}
    planned = {job.nodeid for job in jobs}
    keyed = []
    for job in jobs:
        needed = max(job.devices_needed, asked.get(job.nodeid, 0))
        what = counted(needed, "device") if needed else "cpu"
        chain = job.chain[0].display if job.chain else ""
        platforms = class_of(classes.get(job.nodeid))
        test = QueuedTest(job.display, needed, what, job.estimate, chain, platforms)
        keyed.append(((order.get(job.nodeid, len(order)), job.index, job.id), test))
    for nodeid, needed in asked.items():
        names = classes.get(nodeid)
        if nodeid in planned or names is None:
            continue
        what = counted(needed, "device") if needed else "cpu"
        test = QueuedTest(nodeid, needed, what, estimate_of(nodeid, names), "", class_of(names))
        keyed.append(((order[nodeid], -1, -1), test))
    keyed.sort(key=lambda pair: pair[0])
    return [test for _, test in keyed]


def claimed_jobs(jobs: list[Job]) -> list[Job]:
    """Jobs of one claim, each chain cut to its tests claimed together (a whole chain, but for
    tests that ended under an earlier claim): the first of them leads, as plan/chains.py ties."""
    here = {job.display for job in jobs if job.chain is not None}  # a resumed rerun: alone
    for job in jobs:
        if job.chain is not None:
            kept = tuple(member for member in job.chain if member.display in here)
            job.chain = kept if len(kept) > 1 else None
    return jobs


def work(estimate: float, devices: int) -> float:
    """Slot-seconds a test keeps busy: its estimate on each of its devices (a core without)."""
    return estimate * max(1, devices)


class QueueSource:
    """This job's claims on the run's queue, and the outcomes it owes it."""

    def __init__(
        self,
        url: str,
        run_id: str,
        tests: Sequence[QueuedTest],
        runnable: Sequence[Job],
        devices: int,
        slots: int,
        lease: float,
        host: str,
        platform: tuple[str, str],
        declared: Sequence[str] = (),
    ) -> None:
        """platform: this job's (name, kind); declared: the classes the run covers."""
        self.run_id = run_id
        self.devices = devices
        self.slots = max(1, slots)
        self.url = url
        self.lease = lease
        store = QueueStore(url, run_id)
        self.host, self.platform = host, platform
        try:
            self.published = store.publish(tests, host, declared)
            name, kind = platform
            self.job_id = store.join(host, os.getpid(), devices, name, lease, kind)
            store.fill_chains([t for t in tests if fits(t.platforms, *platform)])
        except BaseException:
            store.close()
            raise
        self.link = QueueLink(url, run_id, lease, store)
        self.heartbeat = Heartbeat(url, run_id, self.job_id, lease)
        self.heartbeat.start()
        self.runnable = {job.display: job for job in runnable}
        # tests of its class this host's plan cannot hold though their device count fits
        # (memory, Ray's shape): never claimed here (the store leaves other classes' alone)
        self.skip = [
            t.test_id
            for t in tests
            if t.test_id not in self.runnable and fits(t.platforms, *platform)
        ]
        self.claims: dict[str, Claim] = {}  # display id → claim not reported yet
        self.held = 0.0  # the work of those claims, in the estimates' slot-seconds
        self.share = float("inf")  # the most it should hold now (claims.guided)
        self.unreported: list[tuple[Claim, str, bool, dict[str, Any]]] = []
        self.cases = JUnitCases(host)  # failure texts and earlier attempts, for the JUnit file
        self.moved = 0  # reruns this job put back on the queue for another job
        self.refused: list[str] = []
        self.lost_claims: dict[str, Claim] = {}  # claims of a lease lost, not ended here yet
        self.withdrawing: list[Job] = []  # for the loop to drop unstarted
        self.lost_leases: list[str] = []  # each lease this job lost, and why
        self.ran = 0
        self.spent = self.estimated = 0.0  # seconds the tests this job ran took, and were given
        self._open = True
        self._looked = 0.0
        self._dry = False  # the last claim found nothing: look again after POLL
        self._wake = False  # closed just now: the loop should look at once
        self._flushed = time.monotonic()
        self.closed = False
        self.joined = ""  # the line the terminal shows once this job joined
        self.notes: list[str] = []  # lines the terminal shows after it (a warning)
        # run before outcomes are reported: what must reach the database first (a recording's
        # dependencies, select/fleet.py)
        self.before_flush: list[Callable[[], None]] = []

    # ---- what the loop asks ----------------------------------------------------------------

    def more(self, now: float) -> list[Job]:
        """Jobs newly claimed for the scheduler (often none): claims when this job runs low."""
        if self.unreported and (len(self.unreported) >= FLUSH_AT or now - self._flushed >= FLUSH):
            self.flush()
        if self.heartbeat.lost:
            self._rejoin()
            if self.heartbeat.lost:  # the database is away: _db says when it stays away
                return []
        scale = self.scale()
        held = scale * self.held
        # enough held: LOW_SECONDS a slot, less as the run drains (its part of what is left)
        low = min(self.slots * LOW_SECONDS, scale * self.share)
        if (self.claims and held >= low) or (self._dry and now - self._looked < POLL):
            return []
        self._looked = now
        seconds = (self.slots * BATCH_SECONDS - held) / scale  # in the estimates' seconds
        claims = self._db(
            lambda s: s.claim(self.job_id, self.devices, seconds, skip=self.skip, guide=True)
        )
        if self.link.store is not None:
            self.share = self.link.store.share
        self._dry = not claims
        for claim in claims or ():
            self.claims[claim.test_id] = claim
            self.held += self._work(claim)
            if claim.attempt > 1:  # a rerun another job moved here: its count goes on
                self._resume(claim)
        if not claims and not self.claims and claims is not None:
            # Claims of other jobs come back when they die: stay while any is open.
            left = self._db(lambda s: s.open_for(self.devices, self.skip, self.platform))
            self._open = left is None or left > 0
            self._wake = not self._open  # the loop ends now, not after its next tick
        return claimed_jobs([self.runnable[claim.test_id] for claim in claims or ()])

    def _rejoin(self) -> None:
        """The lease was lost and its claims went back to the queue: the loop drops what it
        has not started, and this job joins the run again under a new lease."""
        why = self.heartbeat.why
        name, kind = self.platform
        job_id = self._db(
            lambda s: s.join(self.host, os.getpid(), self.devices, name, self.lease, kind)
        )
        if job_id is None:
            return
        self.heartbeat.stop()
        self.lost_claims.update(self.claims)
        self.withdrawing += [self.runnable[test] for test in self.claims]
        self.claims, self.held, self._dry = {}, 0.0, False
        self.lost_leases.append(f"job {self.job_id}: {why}; it joined again as job {job_id}")
        self.job_id = job_id
        self.heartbeat = Heartbeat(self.url, self.run_id, job_id, self.lease)
        self.heartbeat.start()

    def _resume(self, claim: Claim) -> None:
        job = self.runnable[claim.test_id]
        job.chain = None  # a rerun runs alone, as any rerun (run/loop.py)
        job.attempt = claim.attempt
        job.retries_failed, job.retries_infra, job.own_failures = claim.spent
        self.cases.resumed(claim)

    def move(self, job: Job) -> bool:
        """A failed attempt of `job` is to run again: True when its rerun went back to the
        queue for another job (another host's first), which runs it as its next attempt;
        False when no other live job can hold it (or the database is away): it reruns here.
        Called after the attempt's job_end, with the job's reruns spent counted."""
        claim = self.claims.get(job.display)
        if claim is None or self.heartbeat.lost:
            return False
        spent = (job.retries_failed, job.retries_infra, job.own_failures)
        ended = self.cases.attempts(job.display)
        moved = self._db(lambda s: s.move(self.job_id, claim, job.attempt + 1, spent, ended))
        if not moved:
            return False
        del self.claims[job.display]
        self.held = max(0.0, self.held - self._work(claim)) if self.claims else 0.0
        self.cases.forget(job.display)
        self.moved += 1
        self._dry = False  # it may come back here when no other job can take it
        return True

    def withdrawn(self) -> list[Job]:
        """Jobs whose claims were lost: the loop drops those it has not started."""
        jobs, self.withdrawing = self.withdrawing, []
        return jobs

    def _db(self, action: Callable[[QueueStore], T]) -> T | None:
        """One call on the queue (link.py); None when the database is away. Away for longer
        than a lease, this job takes nothing more."""
        result = self.link.call(action)
        if self.link.gone:
            self._open = False
        return result

    def _work(self, claim: Claim) -> float:
        return work(claim.estimate, self.runnable[claim.test_id].devices_needed)

    def scale(self) -> float:
        """How this job's tests ran against their estimates (actual / estimated), once a
        slot's worth ended: batches are sized in real seconds, however wrong the estimates."""
        if self.ran < self.slots or self.estimated <= 0:
            return 1.0
        return min(1000.0, max(0.001, self.spent / self.estimated))

    def due(self, now: float) -> float | None:
        """When the loop should ask again: at once after this job closed, else when
        outcomes are due to be reported or the queue is due another look."""
        if self._wake:
            self._wake = False
            return now
        times = [self._flushed + FLUSH] if self.unreported else []
        if self._open and self._dry:
            times.append(self._looked + POLL)
        return min(times, default=None)

    def open(self) -> bool:
        """Whether this job may still get work: tests it could hold are not ended yet (another
        job's claims come back if that job dies). What it claimed is the loop's to finish."""
        return self._open  # a lost lease is joined again (more); a database away closes it

    # ---- what the run tells ----------------------------------------------------------------

    def event(self, event_type: str, fields: Mapping[str, Any]) -> None:
        """A record event (the controller's listener): a final job_end is owed to the queue."""
        if event_type != "job_end":
            return
        if fields.get("retried"):
            self._ran_again(fields)
            return
        claim = self.claims.pop(str(fields.get("nodeid")), None)
        if claim is None:
            lost = self.lost_claims.pop(str(fields.get("nodeid")), None)
            if lost is not None:  # it ran here after its claim went back: not counted
                self.refused.append(lost.test_id)
            return
        self.held = max(0.0, self.held - self._work(claim)) if self.claims else 0.0
        self.ran += 1
        self.spent += float(fields.get("run_time") or 0.0)
        self.estimated += claim.estimate
        result = {k: v for k, v in fields.items() if k not in ("job", "tail")}
        result["tail"] = list(fields.get("tail") or ())[-50:]
        self.cases.fold(claim.test_id, result)
        outcome = str(fields.get("outcome"))
        self.unreported.append((claim, outcome, bool(fields.get("gating")), result))
        if not self.claims:  # ran dry: others may wait on these outcomes, and more may be queued
            self.flush()
            self._dry = False

    def _ran_again(self, fields: Mapping[str, Any]) -> None:
        """An attempt that runs again (here or moved): kept for the final report."""
        test = str(fields.get("nodeid"))
        if test not in self.claims or not fields.get("start"):
            return  # not this run's claim, or ended before it started (no attempt)
        self.cases.ran_again(test, fields)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The failure or skip text pytest shows, for the merged JUnit file."""
        if report.nodeid in self.claims:
            self.cases.note(report)

    def flush(self) -> None:
        """Report the outcomes waiting, in one round trip; those refused are remembered."""
        self._flushed = time.monotonic()
        if self.unreported:
            for first in self.before_flush:
                first()
            waiting = self.unreported
            refused = self._db(lambda s: s.report_many(self.job_id, waiting))
            if refused is not None:  # else they wait for the database to come back
                self.unreported = []
                self.refused += refused

    def close(self) -> list[str]:
        """Report what is owed, give back what did not run, leave the run; notes to say."""
        if self.closed:
            return []
        self.closed = True
        self.heartbeat.stop()
        deadline = time.monotonic() + self.lease
        left = None
        while left is None and time.monotonic() < deadline:  # the database may be back soon
            self.flush()
            left = None if self.unreported else self._db(lambda s: s.leave(self.job_id))
            if left is None:
                time.sleep(POLL)
        self.link.close()
        notes = [self.link.failure] if self.link.failure else []
        notes += [f"queue: this job's lease was lost: {lost}" for lost in self.lost_leases]
        if self.heartbeat.lost:
            notes.append(f"queue: this job's lease was lost: {self.heartbeat.why}")
        if self.refused:
            notes.append(
                f"queue: {counted(len(self.refused), 'outcome')} of this job refused by the "
                "queue, its claim lost (the tests went to other jobs): "
                + ", ".join(self.refused[:3])
                + (", …" if len(self.refused) > 3 else "")
            )
        if self.unreported:
            notes.append(
                f"queue: {counted(len(self.unreported), 'outcome')} of this job could not be "
                f"reported, PostgreSQL at {where(self.url)} did not answer; the queue gives "
                "those tests to other jobs once this job's lease runs out"
            )
        return notes
