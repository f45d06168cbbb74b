"""The endings of attempts that their own reports do not end, and what runs again.

A worker lost under a test (its timeout, a crash, a deadline of another test, a machine
gone), a worker that died before its test, an infra ending devpool saw itself: each is
reported to pytest by the replay, and may run again as a new attempt. A test sent back
untouched (its batch ended before it ran) keeps its attempt. Whether and why a test runs
again is again.py's decision; this part carries it out. The dispatch loop (loop.py)
routes worker events here; this part holds no state of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from devpool.devices.probes import report_text
from devpool.outcomes import Outcome
from devpool.plan.jobs import Job
from devpool.plan.scheduler import Scheduler
from devpool.report.terminal import read_log
from devpool.run import again, clock
from devpool.run.again import Decision, Happened
from devpool.run.attempts import Attempt, State
from devpool.run.context import RunContext
from devpool.run.exits import describe_exit, own_output, worker_log_tail
from devpool.run.health import DeviceHealth
from devpool.run.memory_watch import MemoryWatches
from devpool.run.placing import Placing
from devpool.run.pool import Slot, WorkerPool
from devpool.run.replay import Replay
from devpool.run.source import JobSource
from devpool.worker.capture import crash_output


class Endings:
    """Ends attempts devpool saw end, and queues what runs again (composed by the loop)."""

    def __init__(
        self,
        ctx: RunContext,
        replay: Replay,
        scheduler: Scheduler,
        pool: WorkerPool,
        placing: Placing,
        memory: MemoryWatches,
        health: DeviceHealth,
        attempts: dict[int, Attempt],
        dropped: set[int],
        source: JobSource | None,
    ) -> None:
        self.ctx = ctx
        self.replay = replay
        self.scheduler = scheduler
        self.pool = pool
        self.placing = placing
        self.memory = memory
        self.health = health
        self.attempts = attempts  # the loop's: job id → its current attempt
        self.dropped = dropped  # the loop's: jobs left unrun here
        self.source = source

    def lost_test(self, slot: Slot, attempt: Attempt, code: int | None) -> None:
        """The worker died under a test: its own timeout, a crash, or another's timeout."""
        worker = slot.worker
        duration = clock.now() - attempt.started
        how = describe_exit(code)
        own = own_output(slot, attempt)
        captured = crash_output(worker.log)  # what the test wrote under pytest's capture
        if captured:
            own += "\n" + captured
        if attempt.overrun:  # devpool ended it for using more memory than it declared
            attempt.move(State.CRASHED, self.ctx.emit)
            self.end(attempt, Outcome.FAILED, attempt.overrun, slot, duration, own)
            return
        if slot.killed_for is attempt:
            attempt.move(State.TIMED_OUT, self.ctx.emit)
            limit = attempt.job.request.timeout or 0.0
            detail = f"exceeded its {limit:g}s limit; stacks dumped, then {how}"
            stacks = read_log(worker.stacks)
            extra = (
                own
                + "\n---- stacks at the timeout (faulthandler) ----\n"
                + (stacks or "(the process wrote no stacks)")
            )
            self.end(attempt, Outcome.TIMEOUT, detail, slot, duration, extra)
            return
        if slot.killed_for is not None:
            # devpool ended this worker for another test's deadline: not this test's doing.
            attempt.move(State.LOST, self.ctx.emit)
            why = f"its worker was ended for {slot.killed_for.display}'s timeout"
            self.requeue(slot, attempt, why)
            return
        lost = worker.lost
        if lost:  # the machine went away, not the test: infra, retried elsewhere
            attempt.move(State.LOST, self.ctx.emit)
            self.end(attempt, Outcome.INFRA, f"{lost} while running the test", slot, duration, own)
            return
        attempt.move(State.CRASHED, self.ctx.emit)
        detail = f"worker pid {worker.pid} {how} while running the test"
        ended_by = worker.ended_by  # a rank group: which rank, and how
        if ended_by:
            detail = f"{ended_by} while running the test; the other ranks were ended"
        self.end(attempt, Outcome.CRASHED, detail, slot, duration, own)

    def worker_failed(self, slot: Slot, attempt: Attempt, code: int | None) -> None:
        """A worker died before it ran its test (e.g. a conftest that fails to import)."""
        worker = slot.worker
        how = slot.stuck or worker.lost or describe_exit(code)
        reason = f"worker pid {worker.pid} {how} before running the test; see {worker.log}"
        self.end(attempt, Outcome.INFRA, reason, slot, 0.0, worker_log_tail(slot))

    def end(
        self,
        attempt: Attempt,
        outcome: Outcome,
        detail: str,
        slot: Slot | None,
        duration: float = 0.0,
        extra: str = "",
    ) -> None:
        """An ending devpool saw itself: reported to pytest, run again if it may."""
        decision = again.ask(attempt, Happened.ENDED, self.ctx.settings, outcome)
        worker = slot.worker if slot is not None else None
        self.replay.synthesize(attempt, outcome, detail, duration, worker, extra)
        if slot is not None and outcome.gates:
            self.check_fatal(attempt, slot, extra)
        if decision.runs:
            self.again(slot, attempt, decision)

    def again(self, slot: Slot | None, attempt: Attempt, decision: Decision) -> None:
        """A failed attempt runs again as a new attempt (a fresh worker, other devices first),
        as again.py decided."""
        job = attempt.job
        job.chain = None  # a rerun runs alone, as any rerun
        if decision.whole_device:  # not its doing: once more, alone on a whole device
            job.request = replace(job.request, device_memory=None, device_exclusive=True)
            self.memory.run_alone(job.id)
        elif decision.spends == "infra":
            job.retries_infra += 1
        elif decision.spends == "failed":
            job.retries_failed += 1
        if decision.own_failure:
            job.own_failures += 1  # the test's own ending: a later pass is flaky
        if self.source is not None and decision.movable and self.source.move(job):
            self.dropped.add(job.id)  # it runs on in another job of the queue's run
            return
        job.attempt += 1
        job.queued_at = clock.now()
        self.attempts[job.id] = Attempt(job, job.attempt, alone=decision.whole_device)
        if decision.delay > 0:
            self.placing.delay(job.queued_at + decision.delay, job)  # wait, then run
            return
        self.queue_later(slot, job)

    def requeue(self, slot: Slot, attempt: Attempt, why: str, counts: bool = True) -> None:
        """Back to the queue untouched: it was batched behind an ending that was not its own.

        Being sent back is no outcome: after again.ALONE_AFTER times the test runs next in a
        worker of its own, and its own ending decides. Sent back from there (the worker
        ended with this test next and nothing else sent), the ending was its own. A
        send-back that counts=False (the fair share cut the batch) is never held against it."""
        decision = again.ask(attempt, Happened.SENT_BACK, self.ctx.settings, counts=counts)
        if not decision.runs:
            detail = f"it was next, alone in its worker, and {why}; see {slot.worker.log}"
            self.end(attempt, Outcome.INFRA, detail, slot, 0.0, worker_log_tail(slot))
            return
        attempt.requeue(self.ctx.emit, why, counts)
        attempt.job.setbacks.append(f"sent back: {why}")
        attempt.job.chain = None  # its chain was broken off: it runs as any test now
        if decision.own_worker:
            attempt.job.runs_alone = True
        attempt.job.queued_at = clock.now()
        self.queue_later(slot, attempt.job)

    def queue_later(self, slot: Slot | None, job: Job) -> None:
        if slot is not None and slot.head is not None:
            slot.later.append(job)  # queued once the slot's placement is released
        else:
            self.scheduler.add(job)

    def check_fatal(self, attempt: Attempt, slot: Slot, extra: str = "") -> None:
        """A fatal error in this attempt's own output: the worker goes, the device maybe too."""
        text = "\n".join(report_text(r) for r in attempt.phases)
        text += "\n" + (extra or own_output(slot, attempt))
        if self.health.judge(attempt.devices, text, attempt.display) is not None:
            slot.dirty = True
            if slot.key in self.pool.slots:
                self.pool.retire(slot, clock.now())

    def unsatisfiable(self, jobs: Sequence[tuple[Job, str]]) -> None:
        """Jobs no device of the run can hold end at once, skipped where
        --devpool-skip-unsatisfiable says so, else infra, each with its reason."""
        outcome = Outcome.SKIPPED if self.ctx.settings.skip_unsatisfiable else Outcome.INFRA
        for job, reason in jobs:
            attempt = self.attempts[job.id] = Attempt(job, job.attempt)
            self.replay.synthesize(attempt, outcome, reason, 0.0)

    def unaccounted(self, stopped: bool) -> None:
        """After the loop: a job without its one final outcome is a devpool bug, said loudly
        (stopped: -x, whose jobs sent back after the stop stay unrun, as pytest leaves them)."""
        for job_id, attempt in self.attempts.items():
            if attempt.final or job_id in self.dropped:
                continue
            if stopped and attempt.state in (State.QUEUED, State.LEASED):
                continue
            again.ask(attempt, Happened.LOST_TRACK, self.ctx.settings)  # it ends here, infra
            self.replay.synthesize(
                attempt,
                Outcome.INFRA,
                f"devpool lost track of this test in state {attempt.state.value} (a devpool bug)",
                0.0,
            )
