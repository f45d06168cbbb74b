"""The worker pool: start workers, send them batches, retire them, reap them, end them.

A worker is only where attempts run. The pool knows which process holds which devices,
which attempts were sent to it, and how far along ending it is; it decides nothing about
outcomes.
"""

from __future__ import annotations

import hashlib
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from devpool.backends import Backend, Forks
from devpool.backends import WorkerHandle as Worker
from devpool.backends.layout import Layout
from devpool.devices import memory
from devpool.devices.leases import Lease
from devpool.plan.jobs import Job, Plan
from devpool.plan.scheduler import Placement
from devpool.run import clock
from devpool.run.attempts import Attempt, State
from devpool.run.context import RunContext
from devpool.run.host_leases import host_env, stamp
from devpool.run.leaks import Leaks
from devpool.run.warm import Warm, device_env, template_kind
from devpool.worker import leaks, protocol

STACKS_WAIT = 0.5  # seconds given to faulthandler to write the stacks before SIGTERM
STOP_GRACE = 10.0  # seconds a worker told to stop has before it is killed
KILL_RETRY = 1.0  # seconds between SIGKILLs of a process group that will not go


@dataclass(eq=False)
class Slot:
    """One worker: its placement, the attempts sent to it, and how far along ending it is."""

    worker: Worker
    head: Job | None = None  # the job the scheduler placed: devices are its until "done"
    sent: list[Attempt] = field(default_factory=list)  # sent, not yet ended, in order
    ready_by: float | None = None  # the worker must have collected by then (None: it has)
    stuck: str = ""  # why devpool killed a worker that never got ready
    stopping: bool = False
    stop_by: float = 0.0  # a worker told to stop is killed after this
    killed_for: Attempt | None = None  # devpool is ending it for this attempt's deadline
    dirty: bool = False  # something failed here: the worker is not reused
    later: list[Job] = field(default_factory=list)  # queued again once the placement ends
    streamed: int = 0  # parts sent after the batch's first ("more"), numbered from 1
    memory_file: Path | None = None  # sim: where its tests write the device memory they use
    spawned: float = field(default_factory=clock.now)
    startup: float | None = None  # seconds from spawn to ready, until its first test took it
    leased: float | None = None  # when its lease was taken (monotonic), until its first test
    shape: int = 0  # a rank group's ranks (Job.shape): it runs jobs of that shape only
    cpus: int = 0  # the cpus(n) its threads were sized for (0: the run's share)

    @property
    def key(self) -> int:
        return self.worker.key

    @property
    def current(self) -> Attempt | None:
        """The attempt the worker is running now."""
        # A worker runs its attempts in the order sent: those that ended leave the front,
        # so every look stays short however long a streamed batch grows.
        ended = 0
        for attempt in self.sent:
            if attempt.state is State.SENT or attempt.state is State.STARTED:
                break
            ended += 1
        if ended:
            del self.sent[:ended]
        for attempt in self.sent:
            if attempt.state is State.STARTED:
                return attempt
        return None

    def log_size(self) -> int:
        try:
            return self.worker.log.stat().st_size
        except OSError:
            return 0


class WorkerPool:
    """Every worker of the run, and the placements waiting for retiring workers' devices."""

    def __init__(self, ctx: RunContext, backend: Backend, plan: Plan) -> None:
        self.ctx = ctx
        self.backend = backend
        self.forks: Forks | None = backend.forks()
        self.forked = False  # whether any worker asked a template for a fork
        self.slots: dict[int, Slot] = {}
        self.idle: dict[int, Slot] = {}
        self.starting: dict[int, tuple[Placement, set[int]]] = {}  # job id → retirees
        self.modules_for, self.modules_of_size = _module_lists(ctx, plan)
        # Device and CPU workers fork from a warm template of their kind (run/warm.py).
        self.warm = Warm(ctx, backend, plan, self.modules_of_size)
        self.stdin_for_tests: str | None = None  # -s, one test at a time: the run's stdin
        self.leaks: Leaks | None = None  # the run's leak sweeps (run/leaks.py), set by the loop
        # On Ray: the outcomes of a batch's once-fixtures its worker lacks (run/once.py's).
        self.once_values: Callable[[Worker, list[Attempt]], dict[str, str] | None] = _none

    # ---- what is held ---------------------------------------------------------------------

    def held(self) -> set[int]:
        """Devices of workers that are not stopping."""
        return {d for s in self.slots.values() if not s.stopping for d in s.worker.devices}

    def retiring(self) -> list[int]:
        """Devices of workers told to stop: theirs until the process has exited."""
        return [d for s in self.slots.values() if s.stopping for d in s.worker.devices]

    def all_devices(self) -> set[int]:
        return {d for s in self.slots.values() for d in s.worker.devices}

    # ---- starting ---------------------------------------------------------------------------

    def spawn(self, placement: Placement, lease: Lease | None, now: float) -> Slot:
        job = placement.job
        env = self._env(placement.devices, job)
        memory_file = None
        if self.ctx.memory and job.memory_needed:
            env.update(memory.worker_env(job.memory_needed, self.ctx.memory))
            if self.ctx.inventory.platform.kind == "sim":
                memory_file = self.ctx.log_dir / f"memory-{job.id}-{job.attempt}.json"
                env[memory.SIM_MEMORY_FILE] = str(memory_file)
        if placement.devices and self.ctx.inventory.platform.kind == "sim":
            # What a sim worker keeps allocated between tests (worker/leaks.py's model).
            env[leaks.SIM_HELD_ENV] = str(self.ctx.log_dir / f"held-{job.id}-{job.attempt}.json")
        env.update(host_env(lease))  # DEVPOOL_PORTS, MASTER_ADDR/PORT (run/host_leases.py)
        if job.shape and self.backend.groups_ranks:  # Ray places its own ranks
            worker = self._group(placement.devices, lease, env, job)
        else:
            worker = self._start(placement.devices, lease, env, job)
        if lease is not None:
            lease.set_job(job.nodeid, worker.pid)
        limit = self.ctx.settings.worker_start_timeout
        if not self.backend.local_leases:  # a cluster may first wait for room, up to this
            limit += self.ctx.settings.lease_timeout
        slot = Slot(worker, ready_by=now + limit, memory_file=memory_file, spawned=now)
        slot.shape = job.shape
        slot.cpus = job.request.cpus
        slot.leased = now if lease is not None and lease.devices else None
        self.slots[worker.key] = slot
        return slot

    def send(self, slot: Slot, head: Job, attempts: list[Attempt]) -> bool:
        """Send a batch; False when the worker is gone (its exit is handled as usual)."""
        slot.head = head
        stamp(attempts, slot.worker.lease)
        slot.sent = list(attempts)
        slot.streamed = 0
        if slot.worker.lease is not None and slot.worker.lease.holder.job != head.nodeid:
            slot.worker.lease.set_job(head.nodeid, slot.worker.pid)
        message = protocol.Run(
            job=head.id,
            tests=_tests(attempts),
            fresh_after_failure=self.ctx.settings.fresh_after_failure,
            stdin=self.stdin_for_tests,
            # A failure whose text matches one of these may have poisoned the process (a
            # device context): the worker stops there and its batch goes back untouched.
            fatal=tuple(self.ctx.fatal.sources()) if slot.worker.devices else (),
            once=self.once_values(slot.worker, attempts),
        )
        return slot.worker.send(message)

    def extend(self, slot: Slot, attempts: list[Attempt]) -> bool:
        """Send the next part of the running batch before the worker runs dry ("more")."""
        assert slot.head is not None
        slot.streamed += 1
        stamp(attempts, slot.worker.lease)
        slot.sent += attempts
        once = self.once_values(slot.worker, attempts)
        message = protocol.More(slot.head.id, slot.streamed, _tests(attempts), once)
        return slot.worker.send(message)

    def _start(
        self, devices: tuple[int, ...], lease: Lease | None, env: dict[str, str], job: Job
    ) -> Worker:
        """A worker forked from its kind's template, else a fresh interpreter."""
        worker = self.fork(devices, lease, env, job)
        if worker is None:
            worker = self.backend.start(devices, lease, env, job.request)
        return worker

    def _group(
        self, devices: tuple[int, ...], lease: Lease | None, env: dict[str, str], job: Job
    ) -> Worker:
        """A ranks(n) test's n workers, one per rank with torchrun's environment, as one
        (backends/ranks.py); each sees every device of the test, in rank order."""
        layout = Layout.of(job.request)
        workers = []
        for rank in range(layout.world):
            own = layout.env(rank, "127.0.0.1", layout.own(rank, devices))
            workers.append(self._start(devices, lease, {**env, **own}, job))
        return self.backend.group(workers, job.shape, self.ctx.settings.rank_straggle)

    def fork(
        self, devices: tuple[int, ...], lease: Lease | None, env: dict[str, str], job: Job
    ) -> Worker | None:
        """A worker forked from the warm template of its kind (started now if it was not);
        None: the template cannot fork (unsafe, failed), so a fresh interpreter starts."""
        backend = self.forks
        if not self.warm.on:
            return None
        assert backend is not None
        size = job.devices_needed
        item = self.ctx.items.get(job.nodeid)
        if item is not None and self.warm.leaves_out(size, str(item.path)):
            return None  # its module made the kind's template unsafe (run/warm.py)
        self.forked = True
        env_of = self.warm.template_env(size)
        worker = backend.fork(template_kind(size), env_of, devices, lease, env, request=job.request)
        self._fork_notes()
        return worker

    def _fork_notes(self) -> None:
        """Why a template could not fork: said once, at the end of the run and in the record."""
        if self.forks is not None:
            for note in self.forks.notes():
                self.warm.say(note)

    def _env(self, devices: tuple[int, ...], job: Job) -> dict[str, str]:
        modules = self.modules_for.get((job.devices_needed, job.request.isolate))
        isolated = job.request.isolate or self.ctx.settings.isolation != "worker"
        if modules is not None and isolated:
            # A process that runs one job, or one module's jobs, imports that module alone.
            modules = one_module(self.ctx, job) or modules
        env = device_env(self.ctx, devices)
        if job.request.cpus:
            env.update(self.ctx.threads.env(job.request.cpus))
        if modules is not None:
            env["DEVPOOL_COLLECT_ONLY"] = str(modules)
        return env

    # ---- ending -----------------------------------------------------------------------------

    def retire(self, slot: Slot, now: float) -> None:
        """Ask a worker to stop; it is killed if it has not gone within STOP_GRACE."""
        self.idle.pop(slot.key, None)
        if slot.stopping:
            return
        slot.stopping = True
        slot.stop_by = now + STOP_GRACE
        if not slot.worker.send(protocol.Stop()):
            slot.worker.signal_group(signal.SIGKILL)

    def retire_idle(self, now: float) -> None:
        for slot in list(self.idle.values()):
            self.retire(slot, now)

    def kill(self, slot: Slot) -> None:
        slot.worker.signal_group(signal.SIGKILL)

    def escalate(self, now: float, grace: float) -> None:
        """Timeouts on the process side: slow starts, workers that will not stop, deadlines."""
        if self.forks is not None:
            # First: a template that has not collected in time turns its waiting workers
            # into fresh interpreters, which then have a start timeout of their own.
            self.forks.check(now)
        for slot in self.slots.values():
            fresh_since = slot.worker.fresh_since  # a fork that fell back to a fresh start
            if slot.ready_by is not None and fresh_since is not None:
                slot.ready_by = max(
                    slot.ready_by, fresh_since + self.ctx.settings.worker_start_timeout
                )
            if slot.ready_by is not None and now >= slot.ready_by and not slot.stuck:
                # A conftest or an import that hangs must not hang the whole run.
                limit = self.ctx.settings.worker_start_timeout
                slot.stuck = f"did not finish starting (collection) within {limit:g}s"
                self.kill(slot)
            if slot.stopping and now >= slot.stop_by:
                slot.stop_by = now + KILL_RETRY
                self.kill(slot)
            attempt = slot.killed_for
            if attempt is None:
                attempt = slot.current
                if attempt is None or not attempt.due(now):
                    continue
                # The deadline belongs to this attempt: it alone is ended for it.
                slot.killed_for = attempt
                attempt.kill_stage, attempt.kill_at = 1, now + STACKS_WAIT
                slot.worker.send(protocol.Cancel())  # nothing more starts in this process
                slot.worker.dump_stacks()
            elif attempt.kill_stage == 1 and now >= attempt.kill_at:
                attempt.kill_stage, attempt.kill_at = 2, now + grace
                slot.worker.signal_group(signal.SIGTERM)
            elif attempt.kill_stage == 2 and now >= attempt.kill_at:
                attempt.kill_stage, attempt.kill_at = 3, now + KILL_RETRY
                self.kill(slot)
            elif attempt.kill_stage == 3 and now >= attempt.kill_at:
                attempt.kill_at = now + KILL_RETRY
                self.kill(slot)

    def due(self, now: float) -> list[float]:
        """When escalate() next has something to do."""
        times = self.forks.due() if self.forks is not None else []
        for slot in self.slots.values():
            if slot.ready_by is not None:
                times.append(slot.ready_by)
            if slot.stopping:
                times.append(slot.stop_by)
            attempt = slot.killed_for or slot.current
            if attempt is not None and attempt.kill_stage:
                times.append(attempt.kill_at)
            elif attempt is not None and attempt.deadline is not None:
                times.append(attempt.deadline)
        return times

    def gone(self, slot: Slot) -> int | None:
        """A worker's process ended: reap it, end what it started, free its lease."""
        worker = slot.worker
        asked = slot.stopping and slot.current is None
        asked = asked and not any(a.state is State.SENT for a in slot.sent)
        # A fork that ended as asked, with nothing of its own left: its template reaps it,
        # the loop does not wait for the template's word (backends/local.py).
        code = self.backend.reap(worker, 0.0 if asked and self.forks is not None else 5.0)
        worker.signal_group(signal.SIGKILL)  # nothing the test started may outlive it
        # A fork that ended as asked has ended what its tests left; its status (None) is
        # its template's to tell. Without devices its end is not worth a sweep of the
        # host's processes (2 ms of this loop for every test of --devpool-isolation=job):
        # the run's last sweep still finds what its atexit handlers started.
        clean = asked and (code == 0 or (code is None and not worker.devices))
        if self.leaks is not None and not clean:
            # It died without ending what its tests left (it would have): those left its
            # group too. They end before its devices and ports go to another test.
            self.leaks.sweep(slot.current, list(worker.devices))
        if worker.lease is not None:
            worker.lease.release()
        self.slots.pop(worker.key, None)
        self.idle.pop(worker.key, None)
        return code

    def freed(self, key: int) -> list[Placement]:
        """Placements that waited for this worker's devices and may start now."""
        ready = []
        for job_id, (placement, waiting) in list(self.starting.items()):
            waiting.discard(key)
            if not waiting:
                del self.starting[job_id]
                ready.append(placement)
        return ready

    def shutdown(self) -> None:
        """Always: end every worker (their whole process groups) and free every lease."""
        slots = list(self.slots.values())
        now = clock.now()
        for slot in slots:
            self.retire(slot, now)
        deadline = now + 2.0
        for slot in slots:
            try:
                slot.worker.wait(timeout=max(0.0, deadline - clock.now()))
            except Exception:  # noqa: BLE001 - timeout or interrupted: escalate below
                slot.worker.signal_group(signal.SIGTERM)
        for slot in slots:
            try:
                slot.worker.wait(timeout=1.0)
            except Exception:  # noqa: BLE001
                slot.worker.signal_group(signal.SIGKILL)
                slot.worker.wait()
            slot.worker.signal_group(signal.SIGKILL)
            slot.worker.close()
            if slot.worker.lease is not None:
                slot.worker.lease.release()
        self.slots.clear()
        self.idle.clear()
        self.backend.close()
        if self.forked:
            self._fork_notes()
        elif self.forks is not None:
            # No worker asked for a fork (every test deselected, or none ran here): a
            # template that ended or was closed unused is nothing to tell.
            self.forks.notes()


def _module_lists(
    ctx: RunContext, plan: Plan
) -> tuple[dict[tuple[int, bool], Path], dict[int, Path]]:
    """Per kind of worker, the test modules its jobs live in: a worker imports only those.

    A worker runs jobs of one size only, so it never needs the modules of the others
    (and an 8-device module's heavy imports stay out of CPU workers)."""
    modules: dict[tuple[int, bool], set[str]] = {}
    for job in plan.jobs:
        item = ctx.items.get(job.nodeid)
        if item is None:
            return {}, {}  # a job devpool cannot place in a file: let workers collect all
        key = (job.devices_needed, job.request.isolate)
        modules.setdefault(key, set()).add(str(item.path))
    folder = ctx.run_dir / "collect"
    folder.mkdir(parents=True, exist_ok=True)
    lists = {}
    for (size, isolate), paths in modules.items():
        target = folder / f"size-{size}{'-isolate' if isolate else ''}.txt"
        target.write_text("\n".join(sorted(paths)) + "\n", encoding="utf-8")
        lists[(size, isolate)] = target
    # A template serves every worker of its size, isolated or not.
    sizes: dict[int, set[str]] = {}
    for (size, _), paths in modules.items():
        sizes.setdefault(size, set()).update(paths)
    by_size = {}
    for size, paths in sizes.items():
        target = folder / f"template-{size}.txt"
        target.write_text("\n".join(sorted(paths)) + "\n", encoding="utf-8")
        by_size[size] = target
    return lists, by_size


def one_module(ctx: RunContext, job: Job) -> Path | None:
    """A collect list naming only the job's own module (None when it is not known)."""
    item = ctx.items.get(job.nodeid)
    if item is None:
        return None
    path = str(item.path)
    name = hashlib.sha1(path.encode(), usedforsecurity=False).hexdigest()[:16]
    target = ctx.run_dir / "collect" / f"module-{name}.txt"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path + "\n", encoding="utf-8")
    return target


def _tests(attempts: list[Attempt]) -> tuple[protocol.Test, ...]:
    return tuple(protocol.Test(a.nodeid, a.display, a.number) for a in attempts)


def _none(_worker: Worker, _attempts: list[Attempt]) -> None:
    """No once-fixture's outcome travels with a batch: workers read them from files."""
    return None
