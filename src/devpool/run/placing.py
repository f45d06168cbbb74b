"""Placing jobs: leases, workers to start or reuse, batches sent to them.

The half of the dispatch loop that turns the scheduler's placements into leased devices
and batches of attempts sent to workers. The loop (loop.py) holds one and routes events to
it: what it reads of the loop's, it is given at its construction; the lease waits, the
stall and the reruns waiting out their delay are its own. It holds the parts it asks:
our fair share while other runs wait (fair_share.py), which jobs make a batch
(batches.py), and the endings of jobs that can never be placed here (unstarted.py): no
other run let them through in time, too few healthy devices are left, or nothing runs and
nothing fits.
"""

from __future__ import annotations

from collections.abc import Mapping

from devpool.backends import Backend
from devpool.devices.leases import Holder, Lease
from devpool.devices.lockdir import Blockers, Want
from devpool.plan.jobs import Job
from devpool.plan.scheduler import IdleWorker, Placement, Scheduler
from devpool.run.attempts import Attempt, State
from devpool.run.batches import Batches
from devpool.run.context import RunContext
from devpool.run.fair_share import FairShare
from devpool.run.health import DeviceHealth, Foreign
from devpool.run.host_leases import HostLeases
from devpool.run.pool import Slot, WorkerPool
from devpool.run.replay import Replay
from devpool.run.unstarted import Unstarted


class Placing:
    """Scheduler placements → leases, workers and batches; the loop's starting half."""

    def __init__(
        self,
        ctx: RunContext,
        scheduler: Scheduler,
        backend: Backend,
        pool: WorkerPool,
        replay: Replay,
        foreign: Foreign,
        health: DeviceHealth,
        attempts: Mapping[int, Attempt],
    ) -> None:
        self.ctx = ctx
        self.platform = ctx.inventory.platform
        self.scheduler = scheduler
        self.backend = backend
        self.pool = pool
        self.foreign = foreign
        self.health = health
        self.attempts = attempts  # the loop's: job id → its current attempt
        self.stopped = False  # -x / --maxfail: the loop said stop
        self.fair = FairShare(ctx, scheduler, backend, pool, foreign.say)  # fair_share.py
        self.batches = Batches(ctx, scheduler, attempts)  # batches.py
        self.unstarted = Unstarted(ctx, scheduler, pool, replay, foreign, self.fair, attempts)
        self.blocked_since: dict[int, float] = {}
        # Since when nothing of ours runs and nothing fits: other runs hold, or wait for, what
        # the queue needs (their leases, or the fair share their waiting gives us). It waits.
        self.stalled_since: float | None = None
        self.said_share = False  # the line saying we wait for a fair share, said once
        self.delayed: list[tuple[float, Job]] = []  # reruns waiting out their delay
        self.host = HostLeases(self)  # ports and named resources (run/host_leases.py)

    # ---- what the loop tells it ------------------------------------------------------------

    def delay(self, at: float, job: Job) -> None:
        """--reruns-delay: the job goes back to the scheduler at `at` (monotonic)."""
        self.delayed.append((at, job))

    def stop(self) -> list[Job]:
        """-x / --maxfail reached: place nothing new; the delayed reruns, dropped."""
        self.stopped = True
        dropped = [job for _, job in self.delayed]
        self.delayed = []
        return dropped

    def over_share(self) -> bool:
        """We hold more devices than our fair share while other runs wait."""
        return self.fair.over()

    def trimmed(self, key: int) -> bool:
        """This worker was told to end its batch early: we were over our fair share."""
        return key in self.fair.trimmed

    def leave(self) -> None:
        """The run ends: out of the waiting room of the runs sharing the devices."""
        self.fair.leave()

    # ---- placing ---------------------------------------------------------------------------

    def share(self, now: float) -> None:
        """Hold no more than a fair share of the pool while other runs wait (fair_share.py)."""
        self.fair.share(now, self.blocked_since, self.stalled_since)

    def start(self, now: float) -> bool:
        """Place and start what fits now; True when anything was placed."""
        placed = False
        for at, job in [
            e for e in self.delayed if e[0] <= now and e[1].id not in self.scheduler.running
        ]:
            self.delayed.remove((at, job))
            self.scheduler.add(job)
        while True:
            unavailable = self.foreign.unavailable(now) + self.pool.retiring()
            unavailable += sorted(self.health.unavailable())
            if self.fair.limit is not None:
                held = self.pool.held()
                unheld = sorted(set(self.ctx.inventory.devices) - held - set(unavailable))
                unavailable += unheld[max(0, self.fair.limit - len(held)) :]
            idle = [
                IdleWorker(
                    s.key,
                    s.worker.devices,
                    s.worker.lease.amount if s.worker.lease else None,
                    s.shape,
                    s.cpus,
                )
                for s in self.pool.idle.values()
            ]
            # No lease waits for a template to collect; templates start for what is queued.
            collecting = self.pool.warm.cold_sizes(now, set(self.scheduler.queue.sizes()))
            placements = self.scheduler.schedule(now, unavailable, idle, collecting)
            if not placements:
                return placed
            placed = True
            self.stalled_since = None  # something of ours runs again: no longer stalled
            retried = False
            for placement in placements:
                if not self._launch(placement, now):
                    retried = True
            if not retried:
                return placed

    def _launch(self, placement: Placement, now: float) -> bool:
        """Start one placement; False when a device turned out to be held by another run."""
        job = placement.job
        if placement.reuse is not None:
            self._assign(self.pool.idle.pop(placement.reuse), job, now)
            return True
        if placement.retire:
            for key in placement.retire:
                self.pool.retire(self.pool.slots[key], now)
            self.pool.starting[job.id] = (placement, set(placement.retire))
            return True
        return self.spawn(placement, now)

    def spawn(self, placement: Placement, now: float) -> bool:
        """Take the placement's lease in one call into the lock folder and start its worker;
        False when another run holds part of it (the job waits, holding nothing)."""
        job = placement.job
        lease: Lease | None = None
        if self.backend.local_leases and (placement.devices or self.host.needed(job)):
            holder = Holder.for_this_process(self.ctx.run_id, job.nodeid)
            got = self.ctx.lock_dir.take(self._want(placement), holder)
            if isinstance(got, Blockers):
                if got.host is not None:  # ports or resources: run/host_leases.py
                    self.host.wait(job, got.host, now)
                else:
                    self.scheduler.unplace(job)
                    for planted in [b for b in got.devices if b.unusable]:
                        # Another user made its lock file unusable: the run does without it.
                        self.health.retire(planted.device, str(planted.unusable))
                        self.scheduler.retire_device(planted.device)  # not placed there again
                    held = [b for b in got.devices if not b.unusable]
                    self.foreign.mark(held, now, job.devices_needed)
                return False
            lease = got
            self.host.leased(job, lease)
        if lease is not None and placement.devices:
            ours = {s.worker.pid for s in self.pool.slots.values()}
            if not self.foreign.probe_lease(placement.devices, lease, now, ours):
                self.scheduler.unplace(job)
                return False
            marks = (self.blocked_since.get(job.devices_needed), self.stalled_since)
            since = [t for t in marks if t is not None]
            if since:  # what it waited for other runs before this lease
                job.foreign_wait = max(job.foreign_wait, now - min(since))
            self.ctx.emit(
                "lease",
                job=job.id,
                nodeid=job.nodeid,
                devices=list(placement.devices),
                wait=round(job.foreign_wait, 3),
            )
            self.attempts[job.id].devices = placement.devices
            self.attempts[job.id].move(State.LEASED, self.ctx.emit)
            self.foreign.leased(placement.devices)
        slot = self.pool.spawn(placement, lease, now)
        self._assign(slot, job, now)
        return True

    def _want(self, placement: Placement) -> Want:
        """What the placement needs of the lock folder: devices or their memory, ports,
        named resources."""
        job = placement.job
        ports, port_range, resources, capacity = self.host.want(job)
        shared = bool(placement.devices and self.scheduler.capacity and job.memory_needed)
        return Want(
            self.platform.name,
            placement.devices,
            memory=job.memory_needed if shared else None,
            capacity=self.ctx.memory if shared else {},
            ports=ports,
            port_range=port_range,
            resources=resources,
            resource_capacity=capacity,
        )

    def _assign(self, slot: Slot, job: Job, now: float) -> None:
        attempts = self._sent_to(slot, [job, *self.batches.after(job, self.stopped)])
        self.job_started(slot, job, now)
        self.blocked_since.pop(job.devices_needed, None)
        if not self.pool.send(slot, job, attempts):
            self.pool.kill(slot)  # its exit is handled as usual

    def _sent_to(self, slot: Slot, jobs: list[Job]) -> list[Attempt]:
        """The jobs' attempts, moved to SENT on the worker."""
        attempts = [self.attempts[j.id] for j in jobs]
        for attempt in attempts:
            attempt.worker = slot.key
            attempt.devices = slot.worker.devices
            attempt.move(
                State.SENT, self.ctx.emit, worker=slot.key, worker_pid=slot.worker.pid or None
            )
        return attempts

    def stream(self, slot: Slot) -> None:
        """Send a batch's next part while the worker still has tests of it to run: batches
        stream, with no round trip to the controller between two parts (batches.py)."""
        if self.over_share():
            return  # other runs wait: this worker ends with its batch (WorkerEvents._job_done)
        jobs = self.batches.next_part(slot, self.stopped)
        if not jobs:
            return
        if not self.pool.extend(slot, self._sent_to(slot, jobs)):
            self.pool.kill(slot)  # its exit is handled as usual

    def job_started(self, slot: Slot, job: Job, now: float) -> None:
        self.stalled_since = None
        job.waited = now - job.queued_at
        for device in slot.worker.devices:
            job.device_uses[device] = job.device_uses.get(device, 0) + 1
        self.ctx.emit(
            "job_start",
            job=job.id,
            nodeid=job.display,
            devices=list(slot.worker.devices),
            host=self.ctx.host,
            worker=slot.key,  # its pid: worker_ready's, for a fork not made yet (null here)
            worker_pid=slot.worker.pid or None,
            queue_wait=round(job.waited, 3),
            attempt=job.attempt,
            log=str(slot.worker.log),
        )

    def expire_lease_waits(self, now: float) -> None:
        """Jobs blocked by other runs' leases end `infra` after --devpool-lease-timeout."""
        self.unstarted.expire_lease_waits(now, self.blocked_since)

    def end_unstarted(self, job: Job, reason: str) -> None:
        """A job that will never start here ends `infra`, with the rest of its chain."""
        self.unstarted.end(job, reason)

    def fail_unplaceable(self) -> None:
        """Tests needing more devices than remain healthy end `infra`, never silently skipped."""
        self.unstarted.fail_unplaceable()

    def end_stall(self, now: float) -> None:
        """Nothing of ours runs and nothing was placed: wait for the other runs.

        A job no healthy pool of this host could ever take has already ended
        (`fail_unplaceable`, the plan's unsatisfiable requests). What is left fits an empty
        host, so only other runs keep it out: their leases, or the fair share their waiting
        leaves us. That can change at any moment (a run between two leases holds nothing
        for a while), so the queue waits, as `flock` would, and ends `infra` only after
        --devpool-lease-timeout, naming who held what in the lock folder then."""
        if self.stopped or not len(self.scheduler.queue) or self.delayed:
            return
        if self.pool.slots or self.pool.starting or self.health.pending or self.foreign:
            return
        queued = set(self.scheduler.queue.sizes())
        if queued & set(self.pool.warm.cold_sizes(now)):
            return  # our own templates still collect: nobody else is in the way
        if self.start(now):
            return  # jobs that came back to the queue after this turn's placing
        if self.stalled_since is None:
            self.stalled_since = now
            self.share(now)  # in the waiting room at once: the others make room for us
            held = self.ctx.lock_dir.held_by_others(self.ctx.run_id)
            if held:
                head = min(self.scheduler.queue.heads(), key=lambda job: job.priority())
                self.foreign.waiting(held, head.devices_needed)
            elif not self.said_share:
                self.said_share = True
                waiting = len(self.fair.others())
                self.foreign.say(
                    f"waiting for a fair share of the devices: {waiting} other "
                    f"run{'s' if waiting != 1 else ''} wait for them too"
                )
            return
        timeout = self.ctx.settings.lease_timeout
        waited = now - self.stalled_since
        if waited < timeout:
            return
        self.unstarted.stalled_out(waited)
        self.stalled_since = None
