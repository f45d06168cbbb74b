"""One once-fixture's process of its own (run/once.py holds them all): its devices set
aside, its lease, its start, what it says (setup, teardown), its end, and what it gives back.

    waiting  → devices are set aside for it as they free up (out of the scheduler's pool)
    starting → its lease is taken and its process started (worker/once.py sets it up)
    up       → set up (a value, an error or a skip in its file)
    stopping → its last user ended: its process tears it down
    down     → its process is gone, its lease freed, its devices the scheduler's again
    lost     → its process died before its teardown, or never got its lease
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from devpool.backends import Backend, WorkerHandle
from devpool.devices.leases import Holder, Lease
from devpool.devices.lockdir import Blockers, Want
from devpool.history.durations import TestResult, runner_class
from devpool.plan.jobs import Job
from devpool.plan.once import PLUGIN, OnceFixture, history_id, setup_history_id
from devpool.plan.scheduler import Scheduler
from devpool.run import clock
from devpool.run.attempts import Attempt
from devpool.run.context import RunContext
from devpool.run.host_leases import host_env
from devpool.run.leaks import Leaks
from devpool.run.warm import device_env
from devpool.worker import protocol
from devpool.worker.once import ONCE_DIR_ENV, ONCE_ENV, SHIP_ENV

STOP_GRACE = 60.0  # seconds a teardown may take (unless its timeout says) before SIGKILL
RETRY = 0.5  # seconds between tries of a lease another run holds


class LoopView(Protocol):  # run/loop.py's Loop, as far as once-fixtures read it
    ctx: RunContext
    session: pytest.Session
    scheduler: Scheduler
    backend: Backend
    attempts: dict[int, Attempt]
    dropped: set[int]
    leaks: Leaks
    source: Any  # a queue's claims (queue/source.py), or None
    foreign: Any  # run/health.py's Foreign: devices other runs hold
    stopped: bool  # -x / --maxfail: nothing new starts

    @property
    def pool(self) -> Any: ...

    @property
    def replay(self) -> Any: ...

    def say(self, text: str) -> None: ...


@dataclass(eq=False)
class OnceProcess:
    """One once-fixture of the run, and how far along its process is."""

    fixture: OnceFixture
    loop: LoopView
    state: str = "waiting"
    users: set[int] = field(default_factory=set)  # job ids of the tests that use it
    devices: tuple[int, ...] = ()  # set aside for it, out of the scheduler's pool
    lease: Lease | None = None
    worker: WorkerHandle | None = None
    since: float = 0.0  # monotonic: when it began waiting, or its process started
    began: float = 0.0  # monotonic: when its process was there (a fork may wait on a template)
    next_try: float = 0.0
    stop_by: float = 0.0
    lost: str = ""  # why its users that had not started end infra
    outcome: str = ""  # of its setup: value, error, skip

    @property
    def name(self) -> str:
        return self.fixture.name

    def start(self, now: float, modules: str, user: Job | None = None) -> bool:
        """Set devices aside, take its lease, start its process (on this host, forked from
        the template of its user's kind, as that user's worker would be); False: not yet
        (devices busy, or held by other runs), or lost (its lease wait ran out)."""
        loop, request, ctx = self.loop, self.fixture.request, self.loop.ctx
        missing = request.device_count - len(self.devices)
        if missing > 0:
            # Free devices are set aside as they free up: tests that do not use it cannot
            # keep it waiting for ever.
            busy = {d for run in loop.scheduler.running.values() for d in run.devices}
            busy |= loop.pool.all_devices() | set(loop.foreign.blocked)
            free = [d for d in loop.scheduler.devices if d not in busy]
            taken = tuple(sorted(free, reverse=True)[:missing])
            self.devices += taken
            loop.scheduler.devices = tuple(d for d in loop.scheduler.devices if d not in taken)
            if len(self.devices) < request.device_count:
                return False
        local = loop.backend.local_leases  # on Ray, Ray places it: its node, devices, ports
        if local and not self._leased(now):
            return False
        devices = tuple(sorted(self.devices))
        env = device_env(ctx, devices)
        if request.cpus:
            env.update(ctx.threads.env(request.cpus))
        env.update(host_env(self.lease) if self.lease is not None else {SHIP_ENV: "1"})
        env[ONCE_ENV] = self.name
        if modules:
            env["DEVPOOL_COLLECT_ONLY"] = modules
        worker = loop.pool.fork(devices, self.lease, env, user) if local and user else None
        worker = worker or loop.backend.start(devices, self.lease, env, request)
        if self.lease is not None:
            self.lease.set_job(self.label, worker.pid)
        self.worker, self.state, self.since = worker, "starting", now
        ctx.emit("once_start", fixture=self.name, devices=list(self.devices),
                 ports=list(self.ports), worker_pid=worker.pid or None,  # None: a fork to come
                 log=str(worker.log))  # fmt: skip
        return True

    def _leased(self, now: float) -> bool:
        """Its lease from the lock folder (its devices, ports, resources); False: other runs
        hold part of it (what they do not hold goes back to the tests meanwhile)."""
        loop, request, ctx = self.loop, self.fixture.request, self.loop.ctx
        settings = ctx.settings
        want = Want(ctx.inventory.platform.name, tuple(sorted(self.devices)),
                    ports=request.ports_needed, port_range=settings.ports,
                    resources=dict(request.resources),
                    resource_capacity=dict(settings.resources))  # fmt: skip
        got = ctx.lock_dir.take(want, Holder.for_this_process(ctx.run_id, self.label))
        if isinstance(got, Blockers):
            held = [b for b in got.devices if not b.unusable]
            if held:  # other runs hold some: those wait, the rest go back to the tests
                loop.foreign.mark(held, now, request.device_count)
                self.give_back()
            if now - self.since > settings.lease_timeout:
                self.lose(f"its lease was held by other runs for {settings.lease_timeout:g}s")
            self.next_try = now + RETRY
            return False
        self.lease = got
        for name, count in request.resources:  # named resources: the scheduler's less them
            if name in loop.scheduler.resources:
                loop.scheduler.resources[name] -= count
        return True

    def late(self, now: float) -> bool:
        """Its request's timeout bounds its setup (none: a setup takes what it takes)."""
        limit = self.fixture.request.timeout
        if self.state != "starting" or limit is None:
            return False
        if self.worker is not None and not self.worker.pid:  # its fork waits on a template
            return False
        self.began = self.began or now
        if now - self.began <= limit:
            return False
        self.lost = f"{self.label} did not finish its setup within {limit:g}s"
        return True

    def up(self, event: protocol.OnceUp) -> None:
        self.state, self.outcome = "up", event.outcome
        if event.outcome == "value":
            told = f"set up in {event.seconds:.2f}s on {self.where()}"
        elif event.outcome == "skip":
            told = f"skipped its setup in {event.seconds:.2f}s on {self.where()}: {event.text}"
        else:
            told = f"setup failed in {event.seconds:.2f}s on {self.where()}: {event.text}"
        self.loop.say(f"ONCE {self.name} {told}")
        self.loop.ctx.emit("once_setup", fixture=self.name, outcome=event.outcome,
                           seconds=event.seconds, devices=list(self.devices),
                           ports=list(self.ports), text=event.text)  # fmt: skip
        if event.outcome != "skip":  # what a shard with a user of it pays (capacity/shards.py)
            outcome = "passed" if event.outcome == "value" else "failed"
            self._in_history(setup_history_id(self.name), outcome, event.seconds)

    def down(self, event: protocol.OnceDown, last: Attempt | None) -> None:
        told = f"torn down in {event.seconds:.2f}s on {self.where()}"
        if event.error is not None:
            told += " with an error"
            told += f", reported at the teardown of {last.display}" if last is not None else ""
        self.loop.say(f"ONCE {self.name} {told}")
        self.loop.ctx.emit("once_teardown", fixture=self.name, seconds=event.seconds,
                           devices=list(self.devices), ports=list(self.ports),
                           error=event.error is not None)  # fmt: skip
        self._held_in_history(event.error is not None)

    def _held_in_history(self, error: bool) -> None:
        """The seconds its lease was held, into the duration history (capacity's estimate
        of its lease, history_id); not for a skipped setup, as for a skipped test."""
        if self.outcome == "skip":
            return
        outcome = "passed" if self.outcome == "value" and not error else "failed"
        self._in_history(history_id(self.name), outcome, clock.now() - self.since)

    def _in_history(self, nodeid: str, outcome: str, seconds: float) -> None:
        """One of its figures into the duration history, as a test's result."""
        ctx, platform = self.loop.ctx, self.loop.ctx.inventory.platform.name
        pool = runner_class(platform, len(ctx.inventory.devices))
        ctx.results.append(TestResult(nodeid, outcome, round(seconds, 4), platform,
                                      self.fixture.request.device_count, pool, time.time(),
                                      ctx.run_id))  # fmt: skip

    def stop(self, now: float) -> None:
        """Its last user ended: its process tears it down (killed if it takes too long)."""
        self.state = "stopping"
        self.stop_by = now + (self.fixture.request.timeout or STOP_GRACE)
        if self.worker is not None and not self.worker.send(protocol.Stop()):
            self.worker.signal_group(signal.SIGKILL)

    def gone(self) -> None:
        """Its process ended: reaped, what it left ended, its lease freed; lost when it died
        before its teardown."""
        worker = self.worker
        if worker is None:
            return
        code = self.loop.backend.reap(worker, 5.0)
        worker.signal_group(signal.SIGKILL)  # nothing it started outlives it
        self.worker = None
        self.loop.leaks.sweep(None, list(self.devices))
        if self.state in ("starting", "up"):
            how = f"exited ({code})"
            if code is not None and code < 0:
                how = f"was killed by signal {-code}"
            self.lose(f"{self.label}'s process (pid {worker.pid}) {how}")
        else:
            self.state = "down"
        self.give_back()

    def lose(self, why: str) -> None:
        self.state = "lost"
        self.lost = self.lost or why
        self.loop.say(
            f"ONCE {self.name} lost: {self.lost}; its tests that had not started end infra"
        )
        self.loop.ctx.emit("once_lost", fixture=self.name, why=self.lost)
        if self.worker is not None:
            self.worker.signal_group(signal.SIGKILL)
        self.give_back()

    def give_back(self) -> None:
        """Its devices back to the scheduler, its resources too, its lease freed."""
        scheduler = self.loop.scheduler
        if self.devices:
            scheduler.devices = tuple(sorted(set(scheduler.devices) | set(self.devices)))
            self.devices = ()
        if self.lease is not None:
            for name, count in self.fixture.request.resources:
                if name in scheduler.resources:
                    scheduler.resources[name] += count
            self.lease.release()
            self.lease = None

    @property
    def label(self) -> str:
        return f"once-fixture {self.name}"

    @property
    def ports(self) -> tuple[int, ...]:
        host: Any = self.lease.host if self.lease is not None else None
        return tuple(getattr(host, "ports", ()) or ())

    def where(self) -> str:
        """`sim:3, port 21946 (pid 13416)`."""
        where = str(self.loop.replay.where(tuple(sorted(self.devices))))
        if self.ports:
            where += ", port" + ("s " if len(self.ports) > 1 else " ")
            where += ",".join(map(str, self.ports))
        pid = self.worker.pid if self.worker is not None else None
        return where + (f" (pid {pid})" if pid else "")


def worker_env(config: pytest.Config, run_dir: Path) -> dict[str, str]:
    """What every process of a run with once-fixtures gets: where their outcomes lie. Before
    collection, for the table's; after it, for the marked ones too (the workers forked from
    a template get it then)."""
    check: Any = config.pluginmanager.get_plugin(PLUGIN)
    if check is None or not check.fixtures:  # none (the marked ones: known after collection)
        return {}
    return {ONCE_DIR_ENV: str(run_dir / "once")}
