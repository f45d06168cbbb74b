"""Places Jobs on free devices: the queue, the running set, and the policy that picks.

The scheduler is pure bookkeeping (no processes, no clocks of its own) so that the
same object drives the real controller, the benchmarks and the unit tests.

Devices are handed out whole, or by memory: a job with a device_memory request (given a
capacity per device) shares devices with other such jobs while their sum fits, and never
shares one with a whole-device job.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from devpool.plan.jobs import Job


@dataclass(frozen=True)
class IdleWorker:
    """A warm worker with no job: it holds its devices until reused or retired."""

    key: int
    devices: tuple[int, ...]
    memory: int | None = None  # the bytes per device its lease holds; None: whole devices
    shape: int = 0  # a rank group's ranks (Job.shape): it runs jobs of its own shape only
    cpus: int = 0  # its thread budget's cpus(n) (0: the run's share): jobs that ask the same

    def runs(self, job: Job) -> bool:
        """Whether the job may run here: a rank group of its shape, threads it asked for."""
        return self.shape == job.shape and self.cpus == job.request.cpus


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
    cpu_slots: int  # cores left: a CPU-only job takes one, a CPU-bound device job its load
    closed: set[int] = field(default_factory=set)  # sizes a policy stopped looking at
    # Memory sharing: what each device may hand out, and the bytes that running jobs with
    # memory requests use on devices that run nothing else (such devices are not in free).
    capacity: Mapping[int, int] = field(default_factory=dict)
    shared: dict[int, int] = field(default_factory=dict)
    held_back: set[int] = field(default_factory=set)  # a retiring whole worker's, this pass
    # Named host resources: units free now ([tool.devpool.resources] less running jobs').
    resources: dict[str, int] = field(default_factory=dict)
    # Request sizes whose workers cannot start at fork cost yet (their template collects),
    # and when each is expected to: such a job reserves, as a job waiting for devices does.
    cold: dict[int, float] = field(default_factory=dict)

    def resources_fit(self, job: Job) -> bool:
        """The job's named resources are free now (plan/resources.py reserves them); one
        this scheduler was not given a capacity for does not limit it (the run refuses
        undeclared names before it plans)."""
        return all(self.resources.get(n, k) >= k for n, k in job.request.resources)

    def memory_of(self, job: Job) -> int | None:
        """The job's bytes per device when memory is shared here; None: whole devices."""
        return job.memory_needed if self.capacity else None

    def take(
        self, job: Job, isolate: bool, avoid: frozenset[int] = frozenset()
    ) -> Placement | None:
        """Choose devices (warm worker first, aligned blocks next); None if the job won't fit.

        avoid: devices the job may not use (a reservation it would delay).
        """
        k = job.devices_needed
        if self.slots <= 0 or job.cpu_needed > self.cpu_slots:
            return None
        if k in self.cold or not self.resources_fit(job):
            return None
        memory = self.memory_of(job)
        if memory is not None:
            placement = self._take_memory(job, k, memory, isolate, avoid)
        else:
            placement = self._take_whole(job, k, isolate, avoid)
        if placement is None:
            return None
        self.slots -= 1
        self.cpu_slots -= job.cpu_needed
        for name, count in job.request.resources:
            if name in self.resources:
                self.resources[name] -= count
        return placement

    def _take_whole(
        self, job: Job, k: int, isolate: bool, avoid: frozenset[int]
    ) -> Placement | None:
        if k > len(self.free - avoid):
            return None
        everything = self.free
        self.free = everything - avoid
        try:
            placement = self._choose(job, k, isolate)
        finally:
            self.free = everything
        if len(placement.devices) != k:
            return None
        self.free.difference_update(placement.devices)
        gone = {placement.reuse, *placement.retire}
        for worker in self.idle:
            if worker.key in placement.retire:
                # A retiring worker holds all its devices until it has exited.
                self.free.difference_update(worker.devices)
        self.idle = [w for w in self.idle if w.key not in gone]
        return placement

    def room(self, device: int, retiring: bool = False) -> int:
        """Bytes a memory job could still get on a device now (retiring=True: once the idle
        workers on it have been retired); -1 when the device cannot take one at all."""
        if device in self.held_back or (device not in self.free and device not in self.shared):
            return -1
        left = self.capacity.get(device, 0) - self.shared.get(device, 0)
        if retiring:
            return left
        for worker in self.idle:
            if device in worker.devices:
                left -= left if worker.memory is None else worker.memory
        return left

    def _take_memory(
        self, job: Job, k: int, memory: int, isolate: bool, avoid: frozenset[int]
    ) -> Placement | None:
        """Devices with room for memory bytes each: a warm worker of the same kind first,
        then the fullest devices that still fit (whole devices stay free for whole jobs),
        then devices whose idle workers must be retired first."""
        if not isolate:
            for worker in self.idle:
                # Its own lease already holds the memory: the device need only be usable.
                usable = all(self.room(d, retiring=True) >= memory for d in worker.devices)
                same = worker.memory == memory and len(worker.devices) == k
                same = same and worker.runs(job)
                if same and usable and avoid.isdisjoint(worker.devices):
                    self.idle.remove(worker)
                    self._use(worker.devices, memory)
                    return Placement(job, worker.devices, reuse=worker.key)
        candidates = sorted((self.room(d), d) for d in (self.free | set(self.shared)) - avoid)
        ready = [d for room, d in candidates if room >= memory]
        if len(ready) >= k:
            chosen = tuple(sorted(ready[:k]))
            self._use(chosen, memory)
            return Placement(job, chosen)
        later = [d for room, d in candidates if room < memory]
        later = [d for d in later if self.room(d, retiring=True) >= memory]
        if len(ready) + len(later) < k:
            return None
        chosen = tuple(sorted(ready + later[: k - len(ready)]))
        retire = [w for w in self.idle if set(w.devices) & set(later[: k - len(ready)])]
        for worker in retire:
            self.idle.remove(worker)
            if worker.memory is None:
                self.held_back.update(worker.devices)  # held whole until it has exited
            else:
                self._use(worker.devices, worker.memory)  # still held until it has exited
        self._use(chosen, memory)
        return Placement(job, chosen, retire=tuple(w.key for w in retire))

    def _use(self, devices: Iterable[int], memory: int) -> None:
        for device in devices:
            self.free.discard(device)
            self.shared[device] = self.shared.get(device, 0) + memory

    def _choose(self, job: Job, k: int, isolate: bool) -> Placement:
        if job.device_uses and k:
            return self._least_used(job, k, isolate)
        if not isolate:
            for worker in self.idle:
                whole = worker.memory is None
                fits = len(worker.devices) == k and worker.runs(job)
                if whole and fits and self.free.issuperset(worker.devices):
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
                chosen.extend(d for d in worker.devices if d not in chosen)
                retire.append(worker.key)
        picked = set(sorted(chosen)[:k])
        # Every idle worker on a picked device goes (several memory workers may share one).
        retire = [w.key for w in self.idle if set(w.devices) & picked]
        return Placement(job, tuple(sorted(picked)), retire=tuple(retire))

    def _least_used(self, job: Job, k: int, isolate: bool) -> Placement:
        """For a rerun or repeat: the devices this test has run on least, warm or not."""
        uses = job.device_uses
        chosen = tuple(sorted(sorted(self.free, key=lambda d: (uses.get(d, 0), d))[:k]))
        retire = []
        for worker in self.idle:
            if set(worker.devices) & set(chosen):
                same = worker.devices == chosen and worker.runs(job)
                if same and not isolate and worker.memory is None:
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
        # Quiet jobs (benchmarks) are counted but held back from the lists until nothing
        # else is queued or running (Scheduler.schedule): then one runs, alone. Nothing
        # else waits for them, and they cannot starve.
        self._quiet: list[Job] = []
        for job in jobs:
            self.push(job)

    def push(self, job: Job) -> None:
        if job.request.quiet:
            self._quiet.append(job)
        else:
            self._insert(job)
        self._count += 1

    def _insert(self, job: Job) -> None:
        entries = self._lists.setdefault(job.devices_needed, [])
        bisect.insort(entries, (job.priority(), job.id, job))

    @property
    def held_quiet(self) -> int:
        return len(self._quiet)

    def release_quiet(self) -> None:
        """The first held-back quiet job joins the lists (the caller saw nothing else left)."""
        if self._quiet:
            self._insert(self._quiet.pop(0))

    def take_all(self) -> list[Job]:
        """Every pending job, held-back ones included, in priority order; the queue empties."""
        jobs = sorted([e[2] for entries in self._lists.values() for e in entries], key=Job.priority)
        jobs += self._quiet
        self._lists, self._quiet, self._count = {}, [], 0
        return jobs

    def peek(self, size: int) -> Job:
        return self._lists[size][0][2]

    def pop(self, size: int) -> Job:
        self._count -= 1
        return self._lists[size].pop(0)[2]

    def pop_job(self, job: Job) -> None:
        """Remove one job wherever it stands in its list."""
        if job in self._quiet:
            self._quiet.remove(job)
            self._count -= 1
            return
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
        capacity: Mapping[int, int] | None = None,
        resources: Mapping[str, int] | None = None,
    ) -> None:
        """capacity: what each device may hand out to memory requests (memory.capacity_of);
        without it every job holds whole devices. resources: named host resources'
        capacities ([tool.devpool.resources])."""
        self.capacity = dict(capacity or {})
        self.resources = dict(resources or {})
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
        self,
        now: float,
        unavailable: Iterable[int] = (),
        idle: Sequence[IdleWorker] = (),
        cold: Mapping[int, float] | None = None,
    ) -> list[Placement]:
        """Placements to start now; each is already counted as running.

        cold: request sizes that cannot start yet (their worker template still collects),
        each with the moment it is expected to be ready."""
        if any(run.job.request.quiet for run in self.running.values()):
            return []  # a benchmark is timing itself: nothing starts beside it
        if not self.running and len(self.queue) == self.queue.held_quiet:
            self.queue.release_quiet()  # the rest is done: one benchmark, alone
        out = set(unavailable)
        shared: dict[int, int] = {}
        busy: set[int] = set()
        for run in self.running.values():
            memory = run.job.memory_needed if self.capacity else None
            for device in run.devices:
                if memory is None:
                    busy.add(device)
                else:
                    shared[device] = shared.get(device, 0) + memory
        cpu_running = sum(run.job.cpu_needed for run in self.running.values())
        pool = Pool(
            free=set(self.devices) - busy - set(shared) - out,
            idle=list(idle),
            running=list(self.running.values()),
            slots=self.max_parallel - len(self.running),
            cpu_slots=self.cpu_slots - cpu_running,
            capacity={d: c for d, c in self.capacity.items() if d in self.devices},
            shared={d: used for d, used in shared.items() if d not in out | busy},
            resources=free_resources(self.resources, self.running.values()),
            cold=dict(cold or {}),
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


def free_resources(capacity: Mapping[str, int], running: Iterable[Running]) -> dict[str, int]:
    """Units of each named resource that running jobs leave free."""
    free = dict(capacity)
    for run in running:
        for name, count in run.job.request.resources:
            if name in free:
                free[name] -= count
    return free


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
