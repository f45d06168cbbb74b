"""Our fair share of the devices while other runs wait for them (placing.py's).

The runs that share a host's devices (or a Ray cluster's) say in a waiting room when they
wait (devices/waiting_room.py: the room, and the limit it leaves us). While others wait, this
run holds no more than its share: idle workers over it retire at once, busy ones end with
the test they run and send the rest of their batch back untouched. Placing holds one and
asks it each turn; what it waits for (its blocked sizes, its stall) it passes in.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from devpool.backends import Backend
from devpool.devices.waiting_room import Room, Waiter, WaitingRoom, fair_limit
from devpool.plan.scheduler import Scheduler
from devpool.run.attempts import State
from devpool.run.context import RunContext
from devpool.run.health import FOREIGN_RETRY
from devpool.run.pool import WorkerPool
from devpool.worker import protocol


class FairShare:
    """How many devices this run may hold while other runs wait, and the workers over it."""

    def __init__(
        self,
        ctx: RunContext,
        scheduler: Scheduler,
        backend: Backend,
        pool: WorkerPool,
        say: Callable[[str], None],
    ) -> None:
        self.ctx = ctx
        self.platform = ctx.inventory.platform
        self.scheduler = scheduler
        self.backend = backend
        self.pool = pool
        # The runs that share our devices: a host's lock folder, or a Ray cluster's store.
        self.room: Room = backend.waiting_room(ctx.run_id) or WaitingRoom(
            ctx.lock_dir.path, ctx.run_id, say
        )
        self.limit: int | None = None  # most devices we may hold while other runs wait
        self.shared_at = 0.0
        self.waiting_since: float | None = None  # wall clock, while other runs block us
        self.trimmed: set[int] = set()  # workers told to end their batch: over the share

    def over(self) -> bool:
        """We hold more devices than our fair share while other runs wait."""
        return self.limit is not None and len(self.pool.held()) > self.limit

    def others(self) -> list[Waiter]:
        """The other runs that wait for devices of our platform."""
        return self.room.others(self.platform.name)

    def leave(self) -> None:
        """The run ends: out of the waiting room of the runs sharing the devices."""
        self.room.wait(None)

    def share(
        self, now: float, blocked_since: dict[int, float], stalled_since: float | None
    ) -> None:
        """Hold no more than a fair share of the pool while other runs wait for it."""
        waits = dict(blocked_since)
        for size, since in self.backend.unplaced(now).items():  # Ray: other runs' actors
            waits[size] = min(waits.get(size, since), since)
        if stalled_since is not None and len(self.scheduler.queue):
            head = min(self.scheduler.queue.heads(), key=lambda job: job.priority())
            waits.setdefault(head.devices_needed, stalled_since)
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
            if slot.key in self.pool.idle or slot.stopping or not slot.worker.devices:
                continue  # idle ones were retired above; stopping ones are not held
            held -= len(slot.worker.devices)
            unstarted = any(a.state is State.SENT for a in slot.sent)
            if unstarted and slot.key not in self.trimmed:
                self.trimmed.add(slot.key)
                slot.worker.send(protocol.Cancel())
