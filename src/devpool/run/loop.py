"""The dispatch loop: ties the scheduler, the worker pool, device health and the replay.

It only routes events between the parts it holds, each owning its own state: placements
from the scheduler become leases and batches for the pool (placing.py); worker events move
attempts through their states (attempts.py); running tests' memory is watched
(memory_watch.py); endings are told to pytest by the replay (replay.py), and those the
worker could not report (a crash, a timeout, a lost worker) end through endings.py, and run
again as again.py decides; fatal errors go to device health (health.py). Every job
ends with exactly one final outcome, and the loop always ends: when nothing runs and
nothing left can be placed, the jobs that are left end `infra` with the reason.
"""

from __future__ import annotations

import gc
import time

import pytest

from devpool import compat
from devpool.backends import Backend
from devpool.outcomes import Outcome
from devpool.plan.jobs import Job, Plan
from devpool.plan.policies import Backfill
from devpool.plan.scheduler import Scheduler
from devpool.report import progress
from devpool.run import again
from devpool.run.again import Happened
from devpool.run.attempts import Attempt, State
from devpool.run.context import RunContext
from devpool.run.endings import Endings
from devpool.run.health import FOREIGN_RETRY, DeviceHealth, Foreign
from devpool.run.leaks import Leaks
from devpool.run.memory_watch import MemoryWatches
from devpool.run.once import OnceFixtures
from devpool.run.placing import Placing
from devpool.run.pool import Slot, WorkerPool
from devpool.run.replay import Replay
from devpool.run.source import JobSource
from devpool.run.terminal import TerminalLoan
from devpool.run.warned import WorkerWarnings
from devpool.worker import protocol, wire

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
        self.hook = session.config.hook
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
        self.renamed: set[str] = set()  # tests a worker collected under another parametrize id
        # A test at a debugger's prompt gets the controller's terminal (run/terminal.py).
        self.terminal = TerminalLoan(session.config, backend.local_leases)
        self.leaks = Leaks(ctx, self.say, backend.local_leases)
        self.pool.leaks = self.leaks
        self.once = OnceFixtures(self)  # [tool.devpool.once]: processes of their own
        # Each worker event's handler, `_on_<tag>`: an event without one stops the run here.
        self.handlers = wire.handlers(self, protocol.EVENTS)

    # ---- main loop ------------------------------------------------------------------------

    def run(self) -> None:
        # The collected items and the plan live to the end of the run: out of the cyclic
        # collector's sight, its passes (and pytest's five at exit) skip them.
        gc.freeze()
        self.terminal.live = self.live
        self.pool.stdin_for_tests = self.terminal.stdin_for(
            self.parallel, len(self.plan.jobs), self.say
        )
        self._admit(self.plan.jobs if self.source is None else [], time.monotonic())
        self.endings.unsatisfiable(self.plan.unsatisfiable)
        try:
            while self._busy():
                now = time.monotonic()
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
                        self._on_message(slot, message)
                        self._stop_if_asked()  # at the failure, not after the whole batch
                    if eof:
                        self._on_exit(slot)
                self._check_exits()
                self.ctx.flush_record()  # what waited in the record's buffer goes to disk
                self._stop_if_asked()
                if self.stopped or (not self.scheduler.queue and not self.pool.starting):
                    self.pool.retire_idle(time.monotonic())
                if not placed:
                    self.placing.end_stall(time.monotonic())
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
        now = time.monotonic()
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
            done=sum(self.replay.ended.values()),
            waiting_on=self.foreign.describe() if self.foreign else "",
            counts=self.replay.counted,
        )

    # ---- worker events --------------------------------------------------------------------

    def _on_message(self, slot: Slot, event: protocol.Message) -> None:
        """One event of a worker, to its `_on_<tag>` handler (wire.handlers)."""
        handler = self.handlers.get(type(event))
        if handler is None:
            raise protocol.ProtocolError(f"the run loop has no handler for {event!r:.200}")
        handler(slot, event)

    def _on_ready(self, slot: Slot, event: protocol.Ready) -> None:
        slot.ready_by = None
        slot.startup = time.monotonic() - slot.spawned
        self.ctx.emit(
            "worker_ready",
            worker=slot.key,
            worker_pid=event.pid or slot.worker.pid,
            startup=round(slot.startup, 3),
            devices=list(slot.worker.devices),
        )

    def _on_start(self, slot: Slot, event: protocol.Start) -> None:
        attempt = self._sent(slot, event.nodeid)
        if attempt is None:
            return
        if attempt.job is not slot.head:
            self.placing.job_started(slot, attempt.job, time.monotonic())
        now = time.monotonic()
        cost: dict[str, float] = {}
        if slot.startup is not None:  # the first test of a new worker waited for its start
            cost["startup"] = round(slot.startup, 3)
            slot.startup = None
        if slot.leased is not None:  # a lease held from its taking to the first test
            cost["lease_to_start"] = round(now - slot.leased, 3)
            slot.leased = None
        attempt.start(self.ctx.emit, slot.log_size(), **cost)
        self.memory.watch(slot, attempt)
        self.replay.logstart(attempt.display, tuple(event.location))
        self.placing.stream(slot)

    def _on_report(self, slot: Slot, event: protocol.Report) -> None:
        attempt = slot.current
        if attempt is None:
            return
        data = event.data
        if data.get("when") == "call" and self.memory.overran(slot, attempt):
            data.update(outcome="failed", longrepr=f"[devpool] {attempt.overrun}")
        elif data.get("outcome") == "failed" and self.memory.out_of_memory_beside(attempt, data):
            again.ask(attempt, Happened.RAN_OUT_BESIDE, self.ctx.settings)
        self.replay.replay(attempt, data, slot.worker)

    def _on_finish(self, slot: Slot, event: protocol.Finish) -> None:
        attempt = slot.current
        if attempt is None:
            return
        if isinstance(event.cpu, (int, float)) and event.cpu >= 0:
            attempt.cpu_load = float(event.cpu)
        self._finished(slot, attempt)
        location = tuple(event.location)
        self.hook.pytest_runtest_logfinish(nodeid=attempt.display, location=location)

    def _on_leak(self, slot: Slot, event: protocol.Leak) -> None:
        """What a test left in its worker, ended there (worker/leaks.py); a worker that
        could not be made clean again is retired after this test."""
        attempt = slot.current
        if attempt is not None and attempt.nodeid != event.nodeid:
            attempt = None  # a wider fixture's, found at its teardown
        self.leaks.reported(attempt, protocol.to_object(event), list(slot.worker.devices))
        if event.ended in ("retired", "not permitted"):
            slot.dirty = True

    def _on_shown(self, slot: Slot, event: protocol.Shown) -> None:
        self.replay.show(event.text)

    def _on_debugger(self, slot: Slot, event: protocol.Debugger) -> None:
        self.terminal.asked(slot, event.pid, event.post_mortem)

    def _on_debugger_left(self, slot: Slot, event: protocol.DebuggerLeft) -> None:
        self.terminal.left(slot)

    def _on_quit(self, slot: Slot, event: protocol.Quit) -> None:
        """pytest.exit() in a test, `q` at the debugger: the run ends as plain pytest's."""
        raise pytest.exit.Exception(event.msg, event.returncode)

    def _on_warning(self, slot: Slot, event: protocol.Warned) -> None:
        """A warning a test raised in its worker: for pytest's warnings summary and count."""
        nodeid = event.nodeid
        attempt = slot.current
        if attempt is not None and attempt.nodeid == nodeid:
            nodeid = attempt.display
        self.warned.tell(nodeid, event)

    def _on_renamed(self, slot: Slot, event: protocol.Renamed) -> None:
        """Said once per test: a worker's parametrize id differed, matched by place."""
        if event.nodeid not in self.renamed:
            self.renamed.add(event.nodeid)
            self.say(
                f"{event.nodeid} was collected as {event.as_} in a worker (a parametrize id "
                "built at collection differs); run by its position"
            )

    def _on_imported(self, slot: Slot, event: protocol.Imported) -> None:
        seen = self.ctx.imported.setdefault(len(slot.worker.devices), {})
        seen.update(dict.fromkeys(str(name) for name in event.modules))

    def _on_output(self, slot: Slot, event: protocol.Output) -> None:
        compat.outputs.received(self.session.config, event.pid, event.data)

    def _on_once_up(self, slot: Slot, event: protocol.OnceUp | protocol.OnceDown) -> None:
        raise protocol.ProtocolError(f"a test worker sent {event!r:.200}")  # run/once.py's

    _on_once_down = _on_once_up  # a once-fixture's process's events (run/once.py)

    def _on_missing(self, slot: Slot, event: protocol.Missing) -> None:
        attempt = self._sent(slot, event.nodeid)
        if attempt is not None:
            slot.dirty = True
            why = f"the worker did not collect {attempt.nodeid} (see {slot.worker.log})"
            self.endings.end(attempt, Outcome.INFRA, why, slot)

    def _on_done(self, slot: Slot, event: protocol.Done) -> None:
        if event.through < slot.streamed:
            return  # a part sent meanwhile is on its way: the worker answers it too
        # A batch cut for other runs' fair share (placing.share) says nothing of its tests:
        # those sent back do not count towards running alone.
        trimmed = slot.key in self.placing.trimmed
        cut = "its batch was cut for other runs' fair share"
        why = cut if trimmed else "its batch ended before it ran"
        for attempt in [a for a in slot.sent if a.state is State.SENT]:
            self.endings.requeue(slot, attempt, why, not trimmed)
        slot.sent = []
        self._job_done(slot)

    def _sent(self, slot: Slot, nodeid: str) -> Attempt | None:
        for attempt in slot.sent:
            if attempt.state is State.SENT and attempt.nodeid == nodeid:
                return attempt
        return None

    def _finished(self, slot: Slot, attempt: Attempt) -> None:
        """The worker ran a test to its end: its reports decide, its deadline is void."""
        attempt.move(State.REPORTED, self.ctx.emit)
        outcome = self.replay.finished(attempt, slot.worker)
        decision = again.ask(attempt, Happened.FINISHED, self.ctx.settings, outcome)
        if outcome.gates or decision.runs:
            # An ordinary failure costs only its own outcome: the worker goes on with its
            # batch unless the project asked for a fresh process after every failure, or the
            # failure's output matches a fatal pattern (_check_fatal retires it).
            if self.ctx.settings.fresh_after_failure:
                slot.dirty = True
            self.endings.check_fatal(attempt, slot)
        if decision.runs:
            self.endings.again(slot, attempt, decision)

    def _job_done(self, slot: Slot) -> None:
        head = slot.head
        self._release_head(slot)
        now = time.monotonic()
        isolate = head is not None and head.fresh
        over_share = self.placing.over_share()
        if (
            slot.stopping
            or isolate
            or slot.dirty
            or slot.killed_for is not None
            or slot.worker.spent  # a rank group one rank's ending ended
            or over_share
            or self.ctx.settings.isolation in ("job", "module")
        ):
            self.pool.retire(slot, now)  # a failed test may have left the process in a bad state
        else:
            self.pool.idle[slot.key] = slot

    def _release_head(self, slot: Slot) -> None:
        """The worker is done with its placement: free it, and queue what must run again."""
        if slot.head is not None:
            self.scheduler.finish(slot.head)
            slot.head = None
        for job in slot.later:
            self.scheduler.add(job)
        slot.later = []

    def _check_exits(self) -> None:
        """Workers that died without their pipe closing (a forked child kept it open)."""
        for slot in list(self.pool.slots.values()):
            if slot.worker.poll() is not None and not slot.worker.exited:
                for message in self.backend.drain(slot.worker):
                    self._on_message(slot, message)
                self._on_exit(slot)

    def _on_exit(self, slot: Slot) -> None:
        worker = slot.worker
        if worker.exited:
            return
        self.terminal.left(slot)
        code = self.pool.gone(slot)
        if slot.ready_by is None:  # it was ready for tests: did it hand back its output?
            compat.outputs.exited(self.session.config, worker.pid)
        attempt = slot.current
        waiting = [a for a in slot.sent if a.state is State.SENT]
        if attempt is not None:
            self.endings.lost_test(slot, attempt, code)
        elif waiting and slot.ready_by is not None and not slot.stopping:
            # It never got ready: a conftest that fails to import, a hung collection.
            self.endings.worker_failed(slot, waiting.pop(0), code)
        for other in waiting:
            self.endings.requeue(slot, other, f"its worker pid {worker.pid} ended before it ran")
        slot.sent = []
        self._release_head(slot)
        self._stop_if_asked()  # a crash that reached --maxfail starts nothing that waited
        for placement in self.pool.freed(worker.key):
            self.placing.spawn(placement, time.monotonic())

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
