"""Places Jobs on free devices: the queue, the running set, and the policy that picks.

The scheduler is pure bookkeeping (no processes, no clocks of its own) so that the
same object drives the real controller, the benchmarks and the unit tests.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from devpool.plan import Job


@dataclass(frozen=True)
class IdleWorker:
    """A warm worker with no job: it holds its devices until reused or retired."""

    key: int
    devices: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    """A decision: start `job` on `devices`, reusing one idle worker or retiring some first."""

    job: Job
    devices: tuple[int, ...]
    reuse: int | None = None
    retire: tuple[int, ...] = ()


@dataclass(frozen=True)
class Running:
    job: Job
    devices: tuple[int, ...]
    started: float

    def expected_end(self, now: float) -> float:
        # A job past its estimate is assumed to end very soon: this keeps reservations
        # honest (no backfill on the promise of devices that are overdue).
        return max(self.started + self.job.estimate, now + 1e-3)


@dataclass
class Pool:
    """What the policy may hand out now."""

    free: set[
        int
    ]  # not used by running jobs nor held by other runs (idle workers' devices included)
    idle: list[IdleWorker]
    running: Sequence[Running]
    slots: int  # jobs that may still start (max-parallel)
    cpu_slots: int  # CPU-only jobs that may still start
    closed: set[int] = field(default_factory=set)  # sizes a policy stopped looking at

    def take(self, job: Job, isolate: bool) -> Placement | None:
        """Choose devices (warm worker first, aligned blocks next); None if the job won't fit."""
        k = job.devices_needed
        if self.slots <= 0 or (k == 0 and self.cpu_slots <= 0) or k > len(self.free):
            return None
        placement = self._choose(job, k, isolate)
        if len(placement.devices) != k:
            return None
        self.slots -= 1
        if k == 0:
            self.cpu_slots -= 1
        self.free.difference_update(placement.devices)
        gone = {placement.reuse, *placement.retire}
        for worker in self.idle:
            if worker.key in placement.retire:
                # A retiring worker holds all its devices until it has exited.
                self.free.difference_update(worker.devices)
        self.idle = [w for w in self.idle if w.key not in gone]
        return placement

    def _choose(self, job: Job, k: int, isolate: bool) -> Placement:
        if job.device_uses and k:
            return self._least_used(job, k, isolate)
        if not isolate:
            for worker in self.idle:
                if len(worker.devices) == k and self.free.issuperset(worker.devices):
                    return Placement(job, worker.devices, reuse=worker.key)
        warm = {d for w in self.idle if self.free.issuperset(w.devices) for d in w.devices}
        cold = sorted(self.free - warm)
        if k == 0:
            return Placement(job, ())
        if len(cold) >= k:
            return Placement(job, _aligned(cold, k))
        # Not enough cold devices: take idle workers' devices, fewest workers first.
        chosen = list(cold)
        retire: list[int] = []
        for worker in sorted(self.idle, key=lambda w: len(w.devices)):
            if len(chosen) >= k:
                break
            if worker.devices and self.free.issuperset(worker.devices):
                chosen.extend(worker.devices)
                retire.append(worker.key)
        return Placement(job, tuple(sorted(chosen)[:k]), retire=tuple(retire))

    def _least_used(self, job: Job, k: int, isolate: bool) -> Placement:
        """For a rerun or repeat: the devices this test has run on least, warm or not."""
        uses = job.device_uses
        chosen = tuple(sorted(sorted(self.free, key=lambda d: (uses.get(d, 0), d))[:k]))
        retire = []
        for worker in self.idle:
            if set(worker.devices) & set(chosen):
                if worker.devices == chosen and not isolate:
                    return Placement(job, chosen, reuse=worker.key)
                if not self.free.issuperset(worker.devices):
                    continue
                retire.append(worker.key)
        return Placement(job, chosen, retire=tuple(retire))


def _aligned(devices: Sequence[int], k: int) -> tuple[int, ...]:
    """k of the given sorted devices, preferring a block of consecutive ids aligned to k."""
    available = set(devices)
    for start in range(0, (max(devices) + 1), k):
        block = range(start, start + k)
        if available.issuperset(block):
            return tuple(block)
    for index in range(len(devices) - k + 1):
        window = devices[index : index + k]
        if window[-1] - window[0] == k - 1:
            return tuple(window)
    return tuple(devices[:k])


class Queue:
    """Pending jobs: one list per device count, each kept in priority order.

    Policies walk the lists merged (`in_order`) and stop early, so a pass costs what it
    looks at, not the whole queue.
    """

    def __init__(self, jobs: Iterable[Job] = ()) -> None:
        self._lists: dict[int, list[tuple[tuple[float, int, int], int, Job]]] = {}
        self._count = 0
        for job in jobs:
            self.push(job)

    def push(self, job: Job) -> None:
        entries = self._lists.setdefault(job.devices_needed, [])
        bisect.insort(entries, (job.priority(), job.id, job))
        self._count += 1

    def peek(self, size: int) -> Job:
        return self._lists[size][0][2]

    def pop(self, size: int) -> Job:
        self._count -= 1
        return self._lists[size].pop(0)[2]

    def pop_job(self, job: Job) -> None:
        """Remove one job wherever it stands in its list."""
        entries = self._lists[job.devices_needed]
        index = bisect.bisect_left(entries, (job.priority(), job.id))
        if index >= len(entries) or entries[index][2] is not job:
            index = next(i for i, entry in enumerate(entries) if entry[2] is job)
        del entries[index]
        self._count -= 1

    def of_size_count(self, size: int) -> int:
        return len(self._lists.get(size, ()))

    def sizes(self) -> list[int]:
        return [size for size, entries in self._lists.items() if entries]

    def of_size(self, size: int) -> Iterator[Job]:
        """Jobs of one size, best priority first (a snapshot: safe to pop while walking)."""
        return (entry[2] for entry in list(self._lists.get(size, ())))

    def heads(self) -> list[Job]:
        """The first job of every size, best priority first."""
        heads = [entries[0][2] for entries in self._lists.values() if entries]
        return sorted(heads, key=Job.priority)

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Job]:
        merged = heapq.merge(*(list(entries) for entries in self._lists.values()))
        return (entry[2] for entry in merged)


class Policy(Protocol):
    """Picks which pending jobs start now. Each policy is its own module under policies/."""

    name: str

    def select(self, queue: Queue, pool: Pool, now: float, isolate_all: bool) -> list[Placement]:
        """Placements to start now; the queue entries chosen are popped by the policy."""
        ...


class Scheduler:
    """Queue + running set + a policy; the controller feeds it events and asks for placements."""

    def __init__(
        self,
        devices: Sequence[int],
        policy: Policy,
        max_parallel: int,
        cpu_slots: int,
        isolate_all: bool = False,
    ) -> None:
        self.devices = tuple(devices)
        self.policy = policy
        self.max_parallel = max_parallel
        self.cpu_slots = cpu_slots
        self.isolate_all = isolate_all
        self.queue = Queue()
        self.running: dict[int, Running] = {}

    def add(self, job: Job) -> None:
        self.queue.push(job)

    def schedule(
        self, now: float, unavailable: Iterable[int] = (), idle: Sequence[IdleWorker] = ()
    ) -> list[Placement]:
        """Placements to start now; each is already counted as running."""
        busy = {d for run in self.running.values() for d in run.devices}
        cpu_running = sum(1 for run in self.running.values() if not run.devices)
        pool = Pool(
            free=set(self.devices) - busy - set(unavailable),
            idle=list(idle),
            running=list(self.running.values()),
            slots=self.max_parallel - len(self.running),
            cpu_slots=self.cpu_slots - cpu_running,
        )
        placements = self.policy.select(self.queue, pool, now, self.isolate_all)
        for placement in placements:
            self.running[placement.job.id] = Running(placement.job, placement.devices, now)
        return placements

    def retire_device(self, device: int) -> None:
        """A device went bad: nothing more is placed on it this session."""
        self.devices = tuple(d for d in self.devices if d != device)

    def unplace(self, job: Job) -> None:
        """Undo a placement that could not start (a device turned out to be held elsewhere)."""
        del self.running[job.id]
        self.queue.push(job)

    def finish(self, job: Job) -> None:
        self.running.pop(job.id, None)

    @property
    def idle(self) -> bool:
        return not self.queue and not self.running


def simulate(
    scheduler: Scheduler, jobs: Iterable[Job], duration: Callable[[Job], float] | None = None
) -> float:
    """Run jobs through the scheduler on a simulated clock, as the controller would: the makespan.

    Each job lasts duration(job) (its estimate by default). Capacity reports and the
    benchmarks use this to predict schedules without running anything.
    """
    last = duration or (lambda job: job.estimate)
    for job in jobs:
        scheduler.add(job)
    ends: list[tuple[float, int, Job]] = []
    now = 0.0
    while True:
        for placement in scheduler.schedule(now):
            heapq.heappush(ends, (now + last(placement.job), placement.job.id, placement.job))
        if not ends:
            break
        now = ends[0][0]
        while ends and ends[0][0] <= now:
            scheduler.finish(heapq.heappop(ends)[2])
    if len(scheduler.queue):
        raise RuntimeError(f"{scheduler.policy.name}: {len(scheduler.queue)} jobs never started")
    return now
