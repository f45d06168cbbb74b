"""The controller's side of once-fixtures ([tool.devpool.once], plan/once.py): each runs in
a process of its own with a lease of its own (run/once_process.py), from before its first
user is placed until after its last user ended.

Its users are held back from the scheduler until it is up; then they go, ahead of the
others, and find its value (or its setup's error) in its file (worker/once.py); on Ray, in
the first batch of its users each worker is sent (values_for). Its devices
are out of the scheduler's pool from the moment they are set aside until it is down: no
test gets them meanwhile. After its last user ended, it is stopped. A process that dies
before its teardown is lost: its users that had not started end `infra`, naming it, and it
is not started again. The loop calls hold() as jobs come, tend() each turn, feed() with its
processes' events, and close() at the end.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import Any

from devpool.backends import WorkerHandle
from devpool.outcomes import Outcome
from devpool.plan.jobs import Job
from devpool.plan.once import PLUGIN
from devpool.run import clock
from devpool.run.attempts import Attempt, State
from devpool.run.once_process import LoopView, OnceProcess
from devpool.run.pool import one_module
from devpool.worker import protocol


class OnceFixtures:
    """Every once-fixture of one run of the loop, and the tests that use them."""

    def __init__(self, loop: LoopView) -> None:
        self.loop = loop
        self.ctx = loop.ctx
        check = loop.session.config.pluginmanager.get_plugin(PLUGIN)
        fixtures = tuple(check.fixtures) if check is not None else ()
        self.skipped: Mapping[str, str] = check.skipped if check is not None else {}
        self.fixtures = {f.name: OnceProcess(f, loop) for f in fixtures}
        self.held: list[Job] = []  # users waiting for their fixtures to be up
        self.names: dict[int, tuple[str, ...]] = {}  # job id → its once-fixtures
        # On Ray, outcomes travel with the batches (no shared folder): each fixture's, and
        # the fixtures each worker has been given.
        self.outcomes: dict[str, str] = {}
        self.given: dict[int, set[str]] = {}  # worker key → fixtures sent to it
        if self.fixtures and not loop.backend.local_leases:
            loop.pool.once_values = self.values_for

    # ---- what the loop tells it -----------------------------------------------------------

    def uses(self, job: Job) -> tuple[str, ...]:
        """The once-fixtures a job (with the rest of its chain) uses."""
        if not self.fixtures:
            return ()
        if job.id not in self.names:
            used: dict[str, None] = {}
            for member in job.chain or (job,):
                item = self.ctx.items.get(member.nodeid)
                for name in getattr(item, "fixturenames", ()):
                    if name in self.fixtures:
                        used[name] = None
            self.names[job.id] = tuple(used)
        return self.names[job.id]

    def hold(self, job: Job) -> bool:
        """A job comes to the scheduler: False, it may go; True, it waits here for its
        once-fixtures (or ended already: skipped, or infra for a lost one)."""
        names = self.uses(job)
        if not names:
            return False
        members = job.chain or (job,)
        onces = [self.fixtures[name] for name in names]
        for once in onces:
            once.users.update(member.id for member in members)
            if once.state == "down":  # a queue's later claim needs it again
                once.state = "waiting"
        skipped = [self.skipped[o.name] for o in onces if o.name in self.skipped]
        lost = [o.lost for o in onces if o.state == "lost"]
        if skipped or lost:
            outcome = Outcome.SKIPPED if skipped else Outcome.INFRA
            self._end(job, outcome, (skipped or lost)[0])
            return True
        if all(once.state == "up" for once in onces):
            for member in members:
                member.ahead = True  # it is up already: its users go first
            return False
        for once in onces:
            if once.state == "waiting" and not once.since:
                once.since = clock.now()
        self.held.append(job)
        return True

    def stop(self) -> list[int]:
        """-x / --maxfail: the held jobs stay unrun (their fixtures stop after the rest)."""
        dropped = [member.id for job in self.held for member in job.chain or (job,)]
        self.held = []
        return dropped

    def busy(self) -> bool:
        """Whether the loop must go on for once-fixtures: users held, processes alive."""
        return bool(self.held) or any(o.worker is not None for o in self.fixtures.values())

    def tend(self, now: float) -> None:
        """One turn: start what held users wait for, release users, end those of lost
        fixtures, and stop the fixtures whose last user ended."""
        if not self.fixtures:
            return
        waiting = {name for job in self.held for name in self.uses(job)}
        for once in self.fixtures.values():
            if once.state == "waiting" and once.name in waiting and now >= once.next_try:
                once.start(now, *self._first_user(once))
            if once.worker is not None and once.worker.poll() is not None:
                self.feed(once.worker, self.loop.backend.drain(once.worker), True)
            if once.late(now) and once.worker is not None:
                once.worker.signal_group(signal.SIGKILL)  # its exit makes it lost
            if once.state == "stopping" and now >= once.stop_by and once.worker is not None:
                once.worker.signal_group(signal.SIGKILL)
                once.stop_by = now + 1.0
        self._release()
        self._end_users_of_lost()
        for once in self.fixtures.values():
            if once.state == "up" and self._users_done(once):
                once.stop(now)

    def feed(self, worker: WorkerHandle, messages: list[protocol.Message], eof: bool) -> None:
        """Events of a once-fixture's process; eof: it has ended."""
        once = next((o for o in self.fixtures.values() if o.worker is worker), None)
        if once is None:
            return
        for message in messages:
            if isinstance(message, protocol.OnceUp):
                if message.result is not None:
                    self.outcomes[once.name] = message.result
                once.up(message)
            elif isinstance(message, protocol.OnceDown):
                last = self._last_user(once)
                once.down(message, last)
                if message.error is not None and last is not None:
                    self._teardown_error(last, message.error)
            elif isinstance(message, protocol.Leak):
                fields = {**protocol.to_object(message), "nodeid": once.label}
                self.loop.leaks.reported(None, fields, list(once.devices))
            # Ready, Output, Imported, Warned: nothing the run counts
        if eof:
            once.gone()
            if once.state == "lost":
                self._cancel_sent(once)

    def close(self) -> None:
        """The loop ends: every once-process is ended and its lease freed."""
        for once in self.fixtures.values():
            worker = once.worker
            if worker is not None and once.state in ("up", "stopping") and worker.poll() is None:
                worker.send(protocol.Stop())
                try:
                    worker.wait(timeout=5.0)
                except Exception:  # noqa: BLE001 - it would not stop: killed in gone()
                    worker.signal_group(signal.SIGKILL)
            once.gone()
            once.give_back()

    def values_for(self, worker: WorkerHandle, attempts: list[Attempt]) -> dict[str, str] | None:
        """On Ray: the outcomes of the once-fixtures a batch uses that its worker lacks."""
        given = self.given.setdefault(worker.key, set())
        names = {name for a in attempts for name in self.uses(a.job) if name in self.outcomes}
        fresh = {name: self.outcomes[name] for name in sorted(names - given)}
        given.update(fresh)
        return fresh or None

    # ---- users -----------------------------------------------------------------------------

    def _first_user(self, once: OnceProcess) -> tuple[str, Job | None]:
        """A held user of it, and a list naming its module: its process is forked from the
        template of that user's kind, or, fresh, collects that module alone."""
        for job in self.held:
            modules = one_module(self.ctx, job) if once.name in self.uses(job) else None
            if modules is not None:
                return str(modules), job
        return "", None

    def _release(self) -> None:
        """Held jobs whose fixtures are all up go to the scheduler; those of a lost one end."""
        keep = []
        for job in self.held:
            onces = [self.fixtures[name] for name in self.uses(job)]
            lost = [once.lost for once in onces if once.state == "lost"]
            if lost:
                self._end(job, Outcome.INFRA, lost[0])
            elif all(once.state == "up" for once in onces):
                # Its users go first: the fixture (and its lease) is up no longer than needed.
                for member in job.chain or (job,):
                    member.ahead = True
                self.loop.scheduler.add(job)
            else:
                keep.append(job)
        self.held = keep

    def _end_users_of_lost(self) -> None:
        """Queued users of a lost fixture end infra, naming it (not run against nothing)."""
        lost = {o.name: o.lost for o in self.fixtures.values() if o.state == "lost"}
        if not lost:
            return
        queue = self.loop.scheduler.queue
        for job in [j for j in queue if set(self.uses(j)) & set(lost)]:
            queue.pop_job(job)
            self._end(job, Outcome.INFRA, next(lost[n] for n in self.uses(job) if n in lost))

    def _cancel_sent(self, once: OnceProcess) -> None:
        """Its users sent to a worker but not started come back (and end infra here)."""
        for slot in self.loop.pool.slots.values():
            if any(a.state is State.SENT and once.name in self.uses(a.job) for a in slot.sent):
                slot.worker.send(protocol.Cancel())

    def _end(self, job: Job, outcome: Outcome, why: str) -> None:
        for member in job.chain or (job,):
            self.loop.replay.synthesize(self.loop.attempts[member.id], outcome, why, 0.0)

    def _users_done(self, once: OnceProcess) -> bool:
        if any(once.name in self.uses(job) for job in self.held):
            return False
        source = self.loop.source
        if source is not None and source.open():
            return False  # a queue may still hand this job more of its users
        unrun = (State.QUEUED, State.LEASED) if self.loop.stopped else ()  # -x: they stay so
        for job_id in once.users:
            attempt = self.loop.attempts.get(job_id)
            if attempt is None or attempt.final or job_id in self.loop.dropped:
                continue
            if attempt.state not in unrun:
                return False
        return True

    def _last_user(self, once: OnceProcess) -> Attempt | None:
        ended = [a for j in once.users if (a := self.loop.attempts.get(j)) is not None and a.final]
        return max(ended, key=lambda a: a.history[-1][1] if a.history else 0.0, default=None)

    def _teardown_error(self, last: Attempt, data: dict[str, Any]) -> None:
        """A session fixture's teardown error: plain pytest reports it at the teardown of
        the run's last test; here, of the fixture's last user."""
        config = self.loop.session.config
        report = config.hook.pytest_report_from_serializable(config=config, data=data)
        report.nodeid = last.display
        item = self.ctx.items.get(last.nodeid)
        if item is not None:
            report.location = item.location
        report.devpool_place = last.job.id
        config.hook.pytest_runtest_logreport(report=report)
        self.ctx.emit("report", nodeid=last.display, when="teardown", outcome=report.outcome)
