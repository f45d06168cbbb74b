"""The controller's side of once-fixtures ([tool.devpool.once], plan/once.py): each runs in
a process of its own with a lease of its own, from before its first user is placed until
after its last user ended.

Per fixture, one small state machine:

    waiting  → its users are held back from the scheduler; devices are set aside for it
    starting → its lease is taken and its process started (worker/once.py sets it up)
    up       → its users go to the scheduler; they find its value (or error) in its file
    stopping → its last user ended: its process tears it down
    down     → its process is gone, its lease freed, its devices the scheduler's again
    lost     → its process died before its teardown: its users that had not started end
               `infra`, naming it; it is not started again

Its devices are out of the scheduler's pool from the moment they are set aside until it is
down: no test gets them meanwhile. Its ports and resources are in its lease, which the lock
folder holds for it as for a worker. The loop calls hold() as jobs come, tend() each turn,
feed() with its process's events, and close() at the end.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from devpool.backends import Backend, WorkerHandle
from devpool.devices.leases import Holder, Lease
from devpool.devices.lockdir import Blockers, Want
from devpool.outcomes import Outcome
from devpool.plan.jobs import Job
from devpool.plan.once import PLUGIN, OnceFixture
from devpool.plan.scheduler import Scheduler
from devpool.run.attempts import Attempt, State
from devpool.run.context import RunContext
from devpool.run.host_leases import host_env
from devpool.run.leaks import Leaks
from devpool.run.warm import device_env
from devpool.worker import protocol
from devpool.worker.once import ONCE_DIR_ENV, ONCE_ENV

STOP_GRACE = 60.0  # seconds a teardown may take (unless its timeout says) before SIGKILL
RETRY = 0.5  # seconds between tries of a lease another run holds


class _Source(Protocol):
    def open(self) -> bool: ...


class _LoopView(Protocol):  # run/loop.py's Loop, as far as once-fixtures read it
    ctx: RunContext
    session: pytest.Session
    scheduler: Scheduler
    backend: Backend
    attempts: dict[int, Attempt]
    dropped: set[int]
    leaks: Leaks
    source: Any
    foreign: Any  # run/health.py's Foreign: devices other runs hold
    stopped: bool  # -x / --maxfail: nothing new starts

    @property
    def pool(self) -> Any: ...

    @property
    def replay(self) -> Any: ...

    def say(self, text: str) -> None: ...


@dataclass(eq=False)
class Once:
    """One once-fixture of the run, and how far along it is."""

    fixture: OnceFixture
    state: str = "waiting"
    users: set[int] = field(default_factory=set)  # job ids of the tests that use it
    devices: tuple[int, ...] = ()  # set aside for it, out of the scheduler's pool
    lease: Lease | None = None
    worker: WorkerHandle | None = None
    since: float = 0.0  # monotonic: when it began waiting, or its process started
    next_try: float = 0.0
    stop_by: float = 0.0
    said_down: bool = False
    lost: str = ""  # why its users that had not started end infra

    @property
    def name(self) -> str:
        return self.fixture.name


class OnceFixtures:
    """Every once-fixture of one run of the loop."""

    def __init__(self, loop: _LoopView) -> None:
        self.loop = loop
        self.ctx = loop.ctx
        check = loop.session.config.pluginmanager.get_plugin(PLUGIN)
        fixtures = tuple(check.fixtures) if check is not None else ()
        self.skipped: Mapping[str, str] = check.skipped if check is not None else {}
        if fixtures and not loop.backend.local_leases:
            loop.ctx.run_notes.append(
                "[tool.devpool.once] runs on the local backend only: on Ray, its fixtures "
                "ran in each worker as ordinary session fixtures"
            )
            fixtures = ()
        if fixtures and loop.ctx.settings.select != "off":
            # What a test runs is recorded in its worker: the fixture's code, run elsewhere,
            # would be no test's dependency, and a change to it would select nothing.
            loop.ctx.run_notes.append(
                "[tool.devpool.once] is off in a selective run (--devpool-select): its "
                "fixtures ran in each worker, so that each test records their code"
            )
            fixtures = ()
        self.fixtures = {f.name: Once(f) for f in fixtures}
        self.folder = loop.ctx.run_dir / "once"
        self.held: list[Job] = []  # users waiting for their fixtures to be up
        self.names: dict[int, tuple[str, ...]] = {}  # job id → its once-fixtures
        self.by_worker: dict[int, Once] = {}

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
                once.state, once.said_down = "waiting", False
        skipped = [self.skipped[o.name] for o in onces if o.name in self.skipped]
        lost = [o.lost for o in onces if o.state == "lost"]
        if skipped or lost:
            outcome = Outcome.SKIPPED if skipped else Outcome.INFRA
            for member in members:
                self.loop.replay.synthesize(
                    self.loop.attempts[member.id], outcome, (skipped or lost)[0], 0.0
                )
            return True
        if all(once.state == "up" for once in onces):
            for member in members:
                member.ahead = True  # it is up already: its users go first
            return False
        for once in onces:
            if once.state == "waiting" and not once.since:
                once.since = time.monotonic()
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
        """One turn: set devices aside and start what held users wait for, release users,
        end those of lost fixtures, and stop the fixtures whose last user ended."""
        if not self.fixtures:
            return
        waiting = {name for job in self.held for name in self.uses(job)}
        for once in self.fixtures.values():
            if once.state == "waiting" and once.name in waiting and now >= once.next_try:
                self._start(once, now)
            if once.worker is not None and once.worker.poll() is not None:
                self.feed(once.worker, self.loop.backend.drain(once.worker), True)
            if once.state == "starting" and self._setup_late(once, now):
                once.worker.signal_group(signal.SIGKILL)  # type: ignore[union-attr]
            if once.state == "stopping" and now >= once.stop_by and once.worker is not None:
                once.worker.signal_group(signal.SIGKILL)
                once.stop_by = now + 1.0
        self._release()
        self._end_users_of_lost()
        for once in self.fixtures.values():
            if once.state == "up" and self._users_done(once):
                self._stop(once, now)

    def feed(self, worker: WorkerHandle, messages: list[protocol.Message], eof: bool) -> None:
        """Events of a once-fixture's process; eof: it has ended."""
        once = self.by_worker.get(worker.key)
        if once is None:
            return
        for message in messages:
            if isinstance(message, protocol.OnceUp):
                self._up(once, message)
            elif isinstance(message, protocol.OnceDown):
                self._down(once, message)
            elif isinstance(message, protocol.Leak):
                fields = {**protocol.to_object(message), "nodeid": f"once-fixture {once.name}"}
                self.loop.leaks.reported(None, fields, list(once.devices))
            # Ready, Output, Imported, Warned: nothing the run counts
        if eof:
            self._gone(once)

    def close(self) -> None:
        """The loop ends: every once-process is ended and its lease freed."""
        for once in self.fixtures.values():
            if once.worker is not None:
                if once.state in ("up", "stopping") and once.worker.poll() is None:
                    once.worker.send(protocol.Stop())
                    try:
                        once.worker.wait(timeout=5.0)
                    except Exception:  # noqa: BLE001 - it would not stop: killed below
                        once.worker.signal_group(signal.SIGKILL)
                self._gone(once)
            self._give_back(once)

    # ---- starting -------------------------------------------------------------------------

    def _start(self, once: Once, now: float) -> None:
        request = once.fixture.request
        missing = request.device_count - len(once.devices)
        if missing > 0:
            # Free devices are set aside as they free up: tests that do not use it cannot
            # keep it waiting for ever.
            busy = {d for run in self.loop.scheduler.running.values() for d in run.devices}
            busy |= self.loop.pool.all_devices() | set(self.loop.foreign.blocked)
            free = [d for d in self.loop.scheduler.devices if d not in busy]
            taken = tuple(sorted(free, reverse=True)[:missing])
            once.devices += taken
            self._pool_without(taken)
            if len(once.devices) < request.device_count:
                return
        holder = Holder.for_this_process(self.ctx.run_id, f"once-fixture {once.name}")
        settings = self.ctx.settings
        want = Want(
            self.ctx.inventory.platform.name,
            tuple(sorted(once.devices)),
            ports=request.ports_needed,
            port_range=settings.ports,
            resources=dict(request.resources),
            resource_capacity=dict(settings.resources),
        )
        got = self.ctx.lock_dir.take(want, holder)
        if isinstance(got, Blockers):
            held = [b for b in got.devices if not b.unusable]
            if held:  # other runs hold some: those wait, the rest go back to the tests
                self.loop.foreign.mark(held, now, request.device_count)
                self._give_back(once)
            if now - once.since > settings.lease_timeout:
                self._lose(
                    once, f"its lease was held by other runs for {settings.lease_timeout:g}s"
                )
            once.next_try = now + RETRY
            return
        once.lease = got
        for name, count in request.resources:  # named resources: the scheduler's less them
            if name in self.loop.scheduler.resources:
                self.loop.scheduler.resources[name] -= count
        env = device_env(self.ctx, tuple(sorted(once.devices)))
        if request.cpus:
            env.update(self.ctx.threads.env(request.cpus))
        env.update(host_env(once.lease))
        env[ONCE_ENV] = once.name
        modules = self._modules(once)
        if modules:
            env["DEVPOOL_COLLECT_ONLY"] = modules
        worker = self.loop.backend.start(tuple(sorted(once.devices)), once.lease, env, request)
        once.lease.set_job(f"once-fixture {once.name}", worker.pid)
        once.worker, once.state, once.since = worker, "starting", now
        self.by_worker[worker.key] = once
        self.ctx.emit(
            "once_start",
            fixture=once.name,
            devices=list(once.devices),
            ports=list(_ports(once.lease)),
            worker_pid=worker.pid,
            log=str(worker.log),
        )

    def _modules(self, once: Once) -> str:
        """A list naming one test module that uses it: its process collects that alone."""
        for job in self.held:
            if once.name in self.uses(job):
                item = self.ctx.items.get(job.nodeid)
                if item is not None:
                    self.folder.mkdir(parents=True, exist_ok=True)
                    target = self.folder / f"{once.name}.modules"
                    target.write_text(f"{item.path}\n", encoding="utf-8")
                    return str(target)
        return ""

    def _setup_late(self, once: Once, now: float) -> bool:
        """Its request's timeout bounds its setup (none: a setup takes what it takes)."""
        limit = once.fixture.request.timeout
        if limit is None or now - once.since <= limit:
            return False
        once.lost = f"once-fixture {once.name} did not finish its setup within {limit:g}s"
        return True

    # ---- its process's events --------------------------------------------------------------

    def _up(self, once: Once, event: protocol.OnceUp) -> None:
        once.state = "up"
        where = self._where(once)
        if event.outcome == "value":
            told = f"set up in {event.seconds:.2f}s on {where}"
        elif event.outcome == "skip":
            told = f"skipped its setup in {event.seconds:.2f}s on {where}: {event.text}"
        else:
            told = f"setup failed in {event.seconds:.2f}s on {where}: {event.text}"
        self.loop.say(f"ONCE {once.name} {told}")
        self.ctx.emit(
            "once_setup",
            fixture=once.name,
            outcome=event.outcome,
            seconds=event.seconds,
            devices=list(once.devices),
            ports=list(_ports(once.lease)),
            text=event.text,
        )

    def _down(self, once: Once, event: protocol.OnceDown) -> None:
        once.said_down = True
        last = self._last_user(once)
        told = f"torn down in {event.seconds:.2f}s on {self._where(once)}"
        if event.error is not None:
            told += " with an error" + (
                f", reported at the teardown of {last.display}" if last else ""
            )
        self.loop.say(f"ONCE {once.name} {told}")
        self.ctx.emit(
            "once_teardown",
            fixture=once.name,
            seconds=event.seconds,
            devices=list(once.devices),
            ports=list(_ports(once.lease)),
            error=event.error is not None,
        )
        if event.error is not None and last is not None:
            self._teardown_error(last, event.error)

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

    def _gone(self, once: Once) -> None:
        """Its process ended: reaped, what it left ended, its lease freed."""
        worker = once.worker
        if worker is None:
            return
        code = self.loop.backend.reap(worker, 5.0)
        worker.signal_group(signal.SIGKILL)  # nothing it started outlives it
        self.by_worker.pop(worker.key, None)
        once.worker = None
        self.loop.leaks.sweep(None, list(once.devices))
        if once.state in ("starting", "up"):
            how = (
                f"was killed by signal {-code}"
                if code is not None and code < 0
                else f"exited ({code})"
            )
            self._lose(once, f"once-fixture {once.name}'s process (pid {worker.pid}) {how}")
        else:
            once.state = "down"
        self._give_back(once)

    def _lose(self, once: Once, why: str) -> None:
        once.state = "lost"
        once.lost = once.lost or why
        self.loop.say(
            f"ONCE {once.name} lost: {once.lost}; its tests that had not started end infra"
        )
        self.ctx.emit("once_lost", fixture=once.name, why=once.lost)
        # Tests sent to a worker but not started come back (and end infra here).
        for slot in self.loop.pool.slots.values():
            if any(a.state is State.SENT and once.name in self.uses(a.job) for a in slot.sent):
                slot.worker.send(protocol.Cancel())
        if once.worker is not None:
            once.worker.signal_group(signal.SIGKILL)
        self._give_back(once)

    def _give_back(self, once: Once) -> None:
        """Its devices back to the scheduler, its resources too, its lease freed."""
        scheduler = self.loop.scheduler
        if once.devices:
            scheduler.devices = tuple(sorted(set(scheduler.devices) | set(once.devices)))
            once.devices = ()
        if once.lease is not None:
            for name, count in once.fixture.request.resources:
                if name in scheduler.resources:
                    scheduler.resources[name] += count
            once.lease.release()
            once.lease = None

    # ---- users -----------------------------------------------------------------------------

    def _release(self) -> None:
        """Held jobs whose fixtures are all up go to the scheduler; those of a lost one end."""
        keep = []
        for job in self.held:
            states = {self.fixtures[name].state for name in self.uses(job)}
            if "lost" in states:
                why = next(self.fixtures[n].lost for n in self.uses(job) if self.fixtures[n].lost)
                for member in job.chain or (job,):
                    self.loop.replay.synthesize(
                        self.loop.attempts[member.id], Outcome.INFRA, why, 0.0
                    )
            elif states == {"up"}:
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
            why = next(lost[n] for n in self.uses(job) if n in lost)
            for member in job.chain or (job,):
                self.loop.replay.synthesize(self.loop.attempts[member.id], Outcome.INFRA, why, 0.0)

    def _users_done(self, once: Once) -> bool:
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

    def _stop(self, once: Once, now: float) -> None:
        once.state = "stopping"
        once.stop_by = now + (once.fixture.request.timeout or STOP_GRACE)
        if once.worker is not None and not once.worker.send(protocol.Stop()):
            once.worker.signal_group(signal.SIGKILL)

    def _last_user(self, once: Once) -> Attempt | None:
        ended = [a for j in once.users if (a := self.loop.attempts.get(j)) is not None and a.final]
        return max(ended, key=lambda a: a.history[-1][1] if a.history else 0.0, default=None)

    def _pool_without(self, devices: tuple[int, ...]) -> None:
        if devices:
            scheduler = self.loop.scheduler
            scheduler.devices = tuple(d for d in scheduler.devices if d not in devices)

    def _where(self, once: Once) -> str:
        where = str(self.loop.replay.where(tuple(sorted(once.devices))))
        ports = _ports(once.lease)
        if ports:
            where += ", port" + ("s " if len(ports) > 1 else " ") + ",".join(map(str, ports))
        pid = once.worker.pid if once.worker is not None else None
        return where + (f" (pid {pid})" if pid else "")


def worker_env(config: pytest.Config, run_dir: Path) -> dict[str, str]:
    """What every process of a run with once-fixtures gets: where their outcomes lie."""
    if not config.pluginmanager.has_plugin(PLUGIN):
        return {}
    return {ONCE_DIR_ENV: str(run_dir / "once")}


def _ports(lease: Lease | None) -> tuple[int, ...]:
    host: Any = lease.host if lease is not None else None
    return tuple(getattr(host, "ports", ()) or ())
