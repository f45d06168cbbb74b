"""Placing jobs: fair share between runs, leases, workers to start or reuse, batches.

The half of the dispatch loop that turns the scheduler's placements into leased devices
and batches of attempts sent to workers, and that ends the jobs that can never be placed:
no other run let them through in time, too few healthy devices are left, or nothing runs
and nothing fits. The loop (loop.py) holds one and routes events to it: what it reads of
the loop's, it is given at its construction; the fair share, the lease waits and the reruns
waiting out their delay are its own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from devpool.backends import Backend
from devpool.devices.fairshare import Room, Waiter, WaitingRoom, fair_limit
from devpool.devices.leases import Holder, Lease
from devpool.devices.lockdir import Blockers, Want, describe_holders
from devpool.outcomes import Outcome
from devpool.plan.jobs import Job
from devpool.plan.scheduler import IdleWorker, Placement, Scheduler
from devpool.run.attempts import Attempt, State
from devpool.run.context import RunContext
from devpool.run.health import FOREIGN_RETRY, DeviceHealth, Foreign
from devpool.run.host_leases import HostLeases
from devpool.run.pool import Slot, WorkerPool
from devpool.run.replay import Replay
from devpool.worker import protocol

BATCH_SECONDS = 1.0  # estimated work sent to a worker at once, for small tests
BATCH_MAX = 64
UNKNOWN_SMALL = 0.1  # seconds assumed, for batching only, of a test with no history


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
        self.replay = replay
        self.foreign = foreign
        self.health = health
        self.attempts = attempts  # the loop's: job id → its current attempt
        self.stopped = False  # -x / --maxfail: the loop said stop
        # The runs that share our devices: a host's lock folder, or a Ray cluster's store.
        self.room: Room = backend.waiting_room(ctx.run_id) or WaitingRoom(
            ctx.lock_dir.path, ctx.run_id, foreign.say
        )
        self.limit: int | None = None  # most devices we may hold while other runs wait
        self.shared_at = 0.0
        self.waiting_since: float | None = None  # wall clock, while other runs block us
        self.blocked_since: dict[int, float] = {}
        # Since when nothing of ours runs and nothing fits: other runs hold, or wait for, what
        # the queue needs (their leases, or the fair share their waiting gives us). It waits.
        self.stalled_since: float | None = None
        self.said_share = False  # the line saying we wait for a fair share, said once
        self.trimmed: set[int] = set()  # workers told to end their batch: over the share
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
        return self.limit is not None and len(self.pool.held()) > self.limit

    def leave(self) -> None:
        """The run ends: out of the waiting room of the runs sharing the devices."""
        self.room.wait(None)

    # ---- placing ---------------------------------------------------------------------------

    def share(self, now: float) -> None:
        """Hold no more than a fair share of the pool while other runs wait for it."""
        waits = dict(self.blocked_since)
        for size, since in self.backend.unplaced(now).items():  # Ray: other runs' actors
            waits[size] = min(waits.get(size, since), since)
        if self.stalled_since is not None and len(self.scheduler.queue):
            head = min(self.scheduler.queue.heads(), key=lambda job: job.priority())
            waits.setdefault(head.devices_needed, self.stalled_since)
        newly_blocked = bool(waits) and self.waiting_since is None
        if now - self.shared_at < FOREIGN_RETRY and not newly_blocked:
            return
        self.shared_at = now
        mine = None
        if waits:
            if self.waiting_since is None:
                self.waiting_since = time.time() - (now - min(waits.values()))
            wants = min(waits, key=lambda k: waits[k])
            mine = Waiter(
                self.ctx.run_id,
                os.getpid(),
                self.ctx.host,
                self.platform.name,
                round(self.waiting_since, 3),
                wants,
            )
        else:
            self.waiting_since = None
        self.room.wait(mine)
        pool = len(self.ctx.inventory.devices)
        self.limit = fair_limit(pool, mine, self.room.others(self.platform.name))
        if self.limit is None:
            return
        held = len(self.pool.held())
        for slot in sorted(self.pool.idle.values(), key=lambda s: -len(s.worker.devices)):
            if held <= self.limit:
                break
            held -= len(slot.worker.devices)
            self.pool.retire(slot, now)
        # Busy workers over the share end with the test they run: the rest of each batch
        # goes back untouched (a first run's batches of unknown tests can be long).
        for slot in list(self.pool.slots.values()):
            if held <= self.limit:
                break
            if slot.key in self.pool.idle or not slot.worker.devices:
                continue
            held -= len(slot.worker.devices)
            unstarted = any(a.state is State.SENT for a in slot.sent)
            if unstarted and slot.key not in self.trimmed:
                self.trimmed.add(slot.key)
                slot.worker.send(protocol.Cancel())

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
            if self.limit is not None:
                held = self.pool.held()
                unheld = sorted(set(self.ctx.inventory.devices) - held - set(unavailable))
                unavailable += unheld[max(0, self.limit - len(held)) :]
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
        batch = [job, *self._batch_after(job)]
        attempts = [self.attempts[j.id] for j in batch]
        for attempt in attempts:
            attempt.worker = slot.key
            attempt.devices = slot.worker.devices
            attempt.move(
                State.SENT, self.ctx.emit, worker=slot.key, worker_pid=slot.worker.pid or None
            )
        self.job_started(slot, job, now)
        self.blocked_since.pop(job.devices_needed, None)
        if not self.pool.send(slot, job, attempts):
            self.pool.kill(slot)  # its exit is handled as usual

    def stream(self, slot: Slot) -> None:
        """Send a batch's next part while the worker still has tests of it to run: batches
        stream, with no round trip to the controller between two parts."""
        head = slot.head
        if head is None or slot.stopping or slot.dirty or slot.killed_for is not None:
            return
        if head.request.nodes > 1:
            return  # the ranks of a multi-node worker end a batch together (backends/merge.py)
        if self.over_share():
            return  # other runs wait: this worker ends with its batch (loop._job_done)
        unstarted = [a.job for a in slot.sent if a.state is State.SENT]
        if len(unstarted) * 2 > BATCH_MAX or sum(map(_small, unstarted)) * 2 > BATCH_SECONDS:
            return  # enough left that the worker cannot run dry before the next look
        jobs = self._batch_after(head)
        if not jobs:
            return
        attempts = [self.attempts[j.id] for j in jobs]
        for attempt in attempts:
            attempt.worker = slot.key
            attempt.devices = slot.worker.devices
            attempt.move(
                State.SENT, self.ctx.emit, worker=slot.key, worker_pid=slot.worker.pid or None
            )
        if not self.pool.extend(slot, attempts):
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

    def _batch_after(self, head: Job) -> list[Job]:
        """More small jobs of the head's size for the same worker: per-test messaging stays
        negligible. Sized from expected durations, and never more than a fair part of what is
        left, so the end of the run stays balanced."""
        k = head.devices_needed
        settings = self.ctx.settings
        # --devpool-isolation module: a process runs the tests of one module and no other;
        # they go to it together (streamed in parts), whatever their size or duration.
        module = settings.isolation == "module"
        if head.chain is not None and head.chain[0] is head and not self.stopped:
            # pytest-order / -dependency: the rest of the chain, in order, in this worker.
            return [job for job in head.chain[1:] if self.attempts[job.id].state is State.QUEUED]
        if head.fresh or settings.isolation == "job" or self.stopped:
            return []
        if (k > 1 or head.shape) and not module:
            return []
        queue = self.scheduler.queue
        workers = max(1, settings.cpu_slots if k == 0 else len(self.scheduler.devices))
        cap = min(BATCH_MAX, queue.of_size_count(k) // (2 * workers))
        budget = BATCH_SECONDS - _small(head)
        if module:
            cap, budget = BATCH_MAX, float("inf")
        batch: list[Job] = []
        while len(batch) < cap and queue.of_size_count(k):
            following = queue.peek(k)
            if following.fresh or following.chain is not None or _small(following) > budget:
                break
            if module and following.location[0] != head.location[0]:
                break
            if following.shape != head.shape:  # a rank group runs its own shape only
                break
            if following.cpu_needed != head.cpu_needed:  # the head's slots, its threads
                break
            if following.memory_needed != head.memory_needed:  # a worker's lease is of one kind
                break
            batch.append(queue.pop(k))
            budget -= _small(following)
        return batch

    def expire_lease_waits(self, now: float) -> None:
        """Jobs blocked by other runs' leases end `infra` after --devpool-lease-timeout."""
        busy = {d for run in self.scheduler.running.values() for d in run.devices}
        busy.update(self.pool.retiring())
        blocked = set(self.foreign.blocked)
        free = len(set(self.ctx.inventory.devices) - busy - blocked)
        timeout = self.ctx.settings.lease_timeout
        for head in self.scheduler.queue.heads():
            k = head.devices_needed
            if k == 0 or k <= free or not self.foreign:
                self.blocked_since.pop(k, None)
                continue
            since = self.blocked_since.setdefault(k, now)
            if now - since < timeout:
                continue
            self.scheduler.queue.pop(k)
            waited = now - since
            head.foreign_wait = waited
            reason = (
                f"no lease on {k} {self.platform.name} device{'s' if k != 1 else ''} within "
                f"--devpool-lease-timeout {timeout:g}s (waited {waited:.0f}s): "
                + self.foreign.describe()
            )
            self.end_unstarted(head, reason)

    def end_unstarted(self, job: Job, reason: str) -> None:
        """A job that will never start here ends `infra`; so do the rest of its chain
        (pytest-order / -dependency), which would have run after it in its worker."""
        self.replay.synthesize(self.attempts[job.id], Outcome.INFRA, reason, 0.0)
        if job.chain is None or job.chain[0] is not job:
            return
        for member in job.chain[1:]:
            attempt = self.attempts.get(member.id)
            if attempt is not None and attempt.state is State.QUEUED:
                why = f"the first test of its chain, {job.display}, did not start: {reason}"
                self.replay.synthesize(attempt, Outcome.INFRA, why, 0.0)

    def fail_unplaceable(self) -> None:
        """Tests needing more devices than remain healthy end `infra`, never silently skipped."""
        healthy = len(self.scheduler.devices)
        for size in [k for k in self.scheduler.queue.sizes() if k > healthy]:
            while self.scheduler.queue.of_size_count(size):
                job = self.scheduler.queue.pop(size)
                retired = ", ".join(
                    f"{self.platform.name}:{d} ({why})" for d, why in self.ctx.bad_devices.items()
                )
                reason = (
                    f"needs {size} {self.platform.name} devices; only {healthy} healthy "
                    f"remain after retiring {retired}"
                )
                self.end_unstarted(job, reason)

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
                waiting = len(self.room.others(self.platform.name))
                self.foreign.say(
                    f"waiting for a fair share of the devices: {waiting} other "
                    f"run{'s' if waiting != 1 else ''} wait for them too"
                )
            return
        timeout = self.ctx.settings.lease_timeout
        waited = now - self.stalled_since
        if waited < timeout:
            return
        holders = self.ctx.lock_dir.held_by_others(self.ctx.run_id)
        who = describe_holders(holders)
        if not who:
            waiters = self.room.others(self.platform.name)
            pids = ", ".join(f"pid {w.pid}" for w in waiters) or "none"
            who = f"no other run held anything then; runs waiting for a share: {pids}"
        for job in self.scheduler.queue.take_all():
            job.foreign_wait = waited
            k = job.devices_needed
            reason = (
                f"not placed within --devpool-lease-timeout {timeout:g}s (waited {waited:.0f}s; "
                f"needs {k} {self.platform.name} device{'s' if k != 1 else ''}): {who}"
            )
            self.replay.synthesize(self.attempts[job.id], Outcome.INFRA, reason, 0.0)
        self.stalled_since = None


def _small(job: Job) -> float:
    """A job's expected seconds for batching; a test with no history is taken as small."""
    return job.estimate if job.estimate_known else UNKNOWN_SMALL
