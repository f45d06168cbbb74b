"""The dispatch loop: ties the scheduler, the worker pool, device health and the replay.

It only routes events between the parts it holds, each owning its own state: placements
from the scheduler become leases and batches for the pool (placing.py); worker events,
each to its handler (worker_events.py), move attempts through their states (attempts.py);
running tests' memory is watched (memory_watch.py); endings are told to pytest by the
replay (replay.py), and those the worker could not report (a crash, a timeout, a lost
worker) end through endings.py, and run again as again.py decides; fatal errors go to
device health (health.py). Every job ends with exactly one final outcome, and the loop
always ends: when nothing runs and nothing left can be placed, the jobs that are left end
`infra` with the reason.
"""

from __future__ import annotations

import gc

import pytest

from devpool.backends import Backend
from devpool.plan.jobs import Job, Plan
from devpool.plan.policies import Backfill
from devpool.plan.scheduler import Scheduler
from devpool.report import progress
from devpool.run import clock
from devpool.run.attempts import Attempt, State
from devpool.run.context import RunContext
from devpool.run.endings import Endings
from devpool.run.health import FOREIGN_RETRY, DeviceHealth, Foreign
from devpool.run.leaks import Leaks
from devpool.run.memory_watch import MemoryWatches
from devpool.run.once import OnceFixtures
from devpool.run.placing import Placing
from devpool.run.pool import WorkerPool
from devpool.run.replay import Replay
from devpool.run.source import JobSource
from devpool.run.terminal import TerminalLoan
from devpool.run.warned import WorkerWarnings
from devpool.run.worker_events import WorkerEvents
from devpool.worker import protocol

TICK = 1.0  # longest sleep of the event loop when nothing is due
CHECK_POLL = 0.2  # seconds between looks at running device health checks


class Loop:
    """One run of the dispatch loop: schedule, start, watch, replay, until every job ended."""

    def __init__(
        self,
        ctx: RunContext,
        session: pytest.Session,
        plan: Plan,
        backend: Backend,
        source: JobSource | None = None,
    ) -> None:
        self.ctx = ctx
        self.source = source  # a shared queue's claims: jobs come as the run goes, not all at once
        self.session = session
        self.plan = plan
        settings = ctx.settings
        self.platform = ctx.inventory.platform
        self.parallel = max(
            1, settings.max_parallel or max(len(ctx.inventory.devices), settings.cpu_slots)
        )
        self.scheduler = Scheduler(
            ctx.inventory.devices,
            Backfill(),
            self.parallel,
            settings.cpu_slots,
            isolate_all=settings.isolation == "job",
            capacity=ctx.memory,
            resources=settings.resources,
        )
        self.backend = backend
        self.pool = WorkerPool(ctx, backend, plan)
        self.replay = Replay(ctx, session)
        self.warned = WorkerWarnings(session.config, ctx.items)
        self.foreign = Foreign(ctx, self.say)
        self.health = DeviceHealth(ctx, self.say, local=backend.local_leases)
        self.attempts: dict[int, Attempt] = {}  # job id → its current attempt
        self.dropped: set[int] = set()  # jobs -x / --maxfail left unrun, as pytest does
        self.claimed: set[int] = set()  # a queue's jobs counted in the progress once
        self.stopped = False
        self.live: progress.LiveProgress | None = None
        self.placing = Placing(
            ctx,
            self.scheduler,
            backend,
            self.pool,
            self.replay,
            self.foreign,
            self.health,
            self.attempts,
        )
        self.memory = MemoryWatches(ctx, self.replay.where, self.say)
        self.endings = Endings(
            ctx,
            self.replay,
            self.scheduler,
            self.pool,
            self.placing,
            self.memory,
            self.health,
            self.attempts,
            self.dropped,
            source,
        )
        # A test at a debugger's prompt gets the controller's terminal (run/terminal.py).
        self.terminal = TerminalLoan(session.config, backend.local_leases)
        self.leaks = Leaks(ctx, self.say, backend.local_leases)
        self.pool.leaks = self.leaks
        self.once = OnceFixtures(self)  # [tool.devpool.once]: processes of their own
        self.events = WorkerEvents(
            ctx,
            session.config,
            self.scheduler,
            backend,
            self.pool,
            self.replay,
            self.placing,
            self.memory,
            self.endings,
            self.leaks,
            self.terminal,
            self.warned,
            self.say,
            self._stop_if_asked,
        )

    # ---- main loop ------------------------------------------------------------------------

    def run(self) -> None:
        # The collected items and the plan live to the end of the run: out of the cyclic
        # collector's sight, its passes (and pytest's five at exit) skip them.
        gc.freeze()
        self.terminal.live = self.live
        self.pool.stdin_for_tests = self.terminal.stdin_for(
            self.parallel, len(self.plan.jobs), self.say
        )
        self._admit(self.plan.jobs if self.source is None else [], clock.now())
        self.endings.unsatisfiable(self.plan.unsatisfiable)
        try:
            while self._busy():
                now = clock.now()
                self.pool.escalate(now, self.ctx.settings.timeout_grace)
                if self.memory.watching:
                    # Running tests that use more memory than they declared end now, `failed`.
                    for overrun in self.memory.overrunning(list(self.pool.slots.values())):
                        self.pool.kill(overrun)  # its exit ends the attempt with the overrun
                self._tend_health(now)
                self.once.tend(now)  # before placing: a once-fixture's devices go first
                placed = False
                if not self.stopped:
                    if self.source is not None:
                        self._admit(self.source.more(now), now)
                        self._withdraw(self.source.withdrawn())
                    queued = set(self.scheduler.queue.sizes())
                    if self.pool.warm.start_next(queued):  # templates ahead of their leases
                        self.pool.forked = True
                    self.foreign.recheck(now)
                    self.placing.share(now)
                    placed = self.placing.start(now)
                    self.placing.expire_lease_waits(now)
                self.ctx.flush_record()  # what must not wait goes to disk before the loop sleeps
                for worker, messages, eof in self.backend.poll(self._sleep(now)):
                    slot = self.pool.slots.get(worker.key)
                    if slot is None:
                        self.once.feed(worker, messages, eof)  # a once-fixture's process
                        continue
                    for message in messages:
                        self.events.handle(slot, message)
                        self._stop_if_asked()  # at the failure, not after the whole batch
                    if eof:
                        self.events.exited(slot)
                self.events.check_exits()
                self.ctx.flush_record()  # what waited in the record's buffer goes to disk
                self._stop_if_asked()
                if self.stopped or (not self.scheduler.queue and not self.pool.starting):
                    self.pool.retire_idle(clock.now())
                if not placed:
                    self.placing.end_stall(clock.now())
                if self.live is not None and not self.terminal.lent:
                    self.live.update(self._snapshot())
        finally:
            self.terminal.close()
            self.once.close()
            self.placing.leave()
            self.health.close()
            self.pool.shutdown()
            self.leaks.close()
            self.warned.finish()
            # Back in the collector's sight before plugins' summaries run: frozen objects
            # are no referrers to gc.get_referrers, and e.g. hypothesis's register_random
            # (trio's, at hypothesis's import in its terminal summary) would then warn.
            gc.unfreeze()
        self.endings.unaccounted(self.stopped)

    def _admit(self, jobs: list[Job], now: float) -> None:
        for job in jobs:
            job.queued_at = now
            self.attempts[job.id] = Attempt(job, job.attempt)
            self.dropped.discard(job.id)  # a rerun this run moved away may come back
            if self.source is not None and job.id not in self.claimed:
                self.claimed.add(job.id)  # a queue's job: its progress counts what it claimed
                self.session.testscollected += 1
            head = job.chain is None or job.chain[0] is job  # the rest go with their chain
            if head and not self.once.hold(job):  # users wait for their once-fixtures
                self.scheduler.add(job)

    def _withdraw(self, jobs: list[Job]) -> None:
        """Jobs the source took back: those not started stay unrun here, as -x leaves them
        (a chain's later tests with its first)."""
        queued = {job.id for job in self.scheduler.queue} if jobs else set()
        for job in jobs:
            if job.id in queued:
                self.scheduler.queue.pop_job(job)
                for member in job.chain or (job,):
                    self.dropped.add(member.id)
                    self.claimed.discard(member.id)
                    self.session.testscollected -= 1

    def _busy(self) -> bool:
        queued = bool(len(self.scheduler.queue) or self.placing.delayed) and not self.stopped
        if self.source is not None and not self.stopped and self.source.open():
            return True
        once = self.once.busy()
        return bool(self.pool.slots or self.pool.starting or self.health.pending or queued or once)

    def _sleep(self, now: float) -> float:
        due = [now + (progress.REFRESH if self.live is not None else TICK)]
        due += self.pool.due(now)
        if self.foreign:
            due.append(self.foreign.next_retry(now))
        if self.placing.stalled_since is not None:
            due.append(now + FOREIGN_RETRY)  # other runs' holds change at any moment
        if self.health.checks:
            due.append(now + CHECK_POLL)
        due += [at for at, _ in self.placing.delayed]
        if self.source is not None and (asked := self.source.due(now)) is not None:
            due.append(asked)
        return max(0.0, min(due) - now)

    def _snapshot(self) -> progress.Snapshot:
        now = clock.now()
        running = []
        for slot in self.pool.slots.values():
            attempt = slot.current
            if attempt is not None:
                where = self.replay.where(slot.worker.devices)
                running.append(progress.RunningJob(attempt.display, where, now - attempt.started))
        busy = {d for run in self.scheduler.running.values() for d in run.devices}
        return progress.Snapshot(
            devices_total=len(self.ctx.inventory.devices),
            devices_busy=len(busy),
            queued=len(self.scheduler.queue) + len(self.pool.starting),
            running=running,
            done=sum(self.replay.conclusions.ended.values()),
            waiting_on=self.foreign.describe() if self.foreign else "",
            counts=self.replay.conclusions.counted,
        )

    def _tend_health(self, now: float) -> None:
        self.health.retired += self.leaks.take_stuck()  # a leftover we may not end sees them
        self.health.poll(now)
        self.health.start_checks(self.pool.all_devices(), now)
        if self.health.retired:
            for device in self.health.retired:
                self.scheduler.retire_device(device)
            self.health.retired = []
            self.placing.fail_unplaceable()

    # ---- stopping -------------------------------------------------------------------------

    def _stop_if_asked(self) -> None:
        """-x / --maxfail: stop dispatching as soon as pytest's session says so."""
        if not self.stopped and (self.session.shouldfail or self.session.shouldstop):
            self._stop_dispatch()

    def _stop_dispatch(self) -> None:
        """-x / --maxfail reached: start nothing new, let running tests finish."""
        self.stopped = True
        for slot in self.pool.slots.values():
            if any(a.state is State.SENT for a in slot.sent):
                slot.worker.send(protocol.Cancel())
        for job in self.scheduler.queue.take_all():
            self.dropped.add(job.id)
            self.dropped.update(member.id for member in job.chain or ())
        self.dropped.update(job.id for job in self.placing.stop())
        self.dropped.update(self.once.stop())
        for job_id, (placement, _) in list(self.pool.starting.items()):
            self.scheduler.finish(placement.job)
            self.dropped.add(placement.job.id)
            del self.pool.starting[job_id]

    def say(self, text: str) -> None:
        self.replay.say(text)
