"""Priority order with EASY backfilling: small jobs fill gaps without delaying the first big one."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator

from devpool.plan.jobs import Job
from devpool.plan.resources import ResourceReservations
from devpool.plan.scheduler import Placement, Pool, Queue

# A pass looks past at most this many jobs of one size that may not backfill (too long
# for the reservation), so a pass stays cheap on a queue of thousands.
LOOK_PAST = 64


class Backfill:
    """Start jobs in priority order; the first job that does not fit reserves devices.

    Jobs behind it may start ("backfill") only if, by their estimate, they end before
    that reservation, or use devices the reserved job will not need. This is EASY
    backfilling: the first waiting big job is never starved by a stream of small ones.
    """

    name = "backfill"

    def select(self, queue: Queue, pool: Pool, now: float, isolate_all: bool) -> list[Placement]:
        if pool.capacity:
            return _select_shared(queue, pool, now, isolate_all)
        placements: list[Placement] = []
        shadow: float | None = None  # when the reserved job is expected to start
        spare = 0  # devices free at that moment beyond what the reserved job needs
        skipped: dict[int, int] = {}
        held = ResourceReservations()  # named host resources reserve on their own
        cores_held = False  # a CPU-bound device job waits for cores: none go to jobs behind it
        for job in _walk(queue, pool):
            if pool.slots <= 0:
                break
            if cores_held and job.cpu_needed:
                continue
            if held.blocked(job, pool, placements, now) or not held.allows(job, now):
                continue
            k = job.devices_needed
            if k in pool.cold:
                # Its workers' template still collects: it reserves from when that is
                # expected to be done (or its devices free), as a job too big for now does.
                if shadow is None and k > 0:
                    when, spare = _reservation(k, pool, placements, now)
                    shadow = max(when, pool.cold[k])
                continue
            if k > len(pool.free):
                if shadow is None:
                    shadow, spare = _reservation(k, pool, placements, now)
                continue
            if job.cpu_needed > pool.cpu_slots:
                cores_held = cores_held or k > 0
                continue
            if shadow is not None and k > 0:
                ends_in_time = now + job.estimate <= shadow
                if not ends_in_time and k > spare:
                    skipped[k] = skipped.get(k, 0) + 1
                    if skipped[k] > LOOK_PAST:
                        pool.closed.add(k)
                    continue
                if not ends_in_time:
                    spare -= k
            placement = pool.take(job, isolate_all or job.fresh)
            if placement is None:
                continue
            queue.pop_job(job)
            placements.append(placement)
            held.took(job, now)
        return placements


def _walk(queue: Queue, pool: Pool) -> Iterator[Job]:
    """Pending jobs in priority order, leaving out sizes that can no longer start this pass."""
    iterators = {size: queue.of_size(size) for size in queue.sizes()}
    frontier: list[tuple[tuple[float, int, int], int, Job]] = []
    for jobs in iterators.values():
        first = next(jobs, None)
        if first is not None:
            frontier.append((first.priority(), first.id, first))
    heapq.heapify(frontier)
    first_blocked = True
    while frontier:
        _, _, job = heapq.heappop(frontier)
        size = job.devices_needed
        too_big = size > len(pool.free) or (size == 0 and pool.cpu_slots <= 0)
        if size in pool.closed or (too_big and (size == 0 or not first_blocked)):
            continue  # free devices only shrink within a pass: none of this size fits now
        if too_big:
            first_blocked = False  # this one sets the reservation; later ones can't fit
        yield job
        if size in pool.cold:
            continue  # none of its size starts this pass; the first one may reserve
        following = next(iterators[size], None)
        if following is not None:
            heapq.heappush(frontier, (following.priority(), following.id, following))


def _reservation(k: int, pool: Pool, placed: list[Placement], now: float) -> tuple[float, int]:
    """When k devices will be free given the running jobs' estimates, and how many spare then."""
    ends = [(run.expected_end(now), len(run.devices)) for run in pool.running]
    ends += [(now + p.job.estimate, len(p.devices)) for p in placed]
    available = len(pool.free)
    moment = now
    for end, devices in sorted(ends):
        if available >= k:
            break
        available += devices
        moment = end
    if available < k:
        # Devices held by other runs: no time promise can be made. Still protect the
        # waiting job: backfill only what ends before everything of ours has ended.
        return moment, 0
    return moment, available - k


def _select_shared(queue: Queue, pool: Pool, now: float, isolate_all: bool) -> list[Placement]:
    """Backfill where devices are shared by memory: the reservation is a set of devices.

    The first device job that does not fit reserves the devices it could have earliest
    (whole, or with room for its memory) and when. A job behind it that would still run
    then may start only away from those devices, so a whole-device job is never starved
    by a stream of small memory jobs, nor a large memory job by smaller ones.
    """
    placements: list[Placement] = []
    reserved: tuple[float, frozenset[int]] | None = None
    passed = 0
    held = ResourceReservations()  # named host resources reserve on their own
    for job in queue:  # a snapshot in priority order: popping while walking is safe
        if pool.slots <= 0 or passed > LOOK_PAST:
            break
        if job.devices_needed in pool.cold:
            continue  # its template still collects (no reservation on shared devices)
        if held.blocked(job, pool, placements, now) or not held.allows(job, now):
            continue
        isolate = isolate_all or job.fresh
        if reserved is None or job.devices_needed == 0:
            placement = pool.take(job, isolate)
            if placement is None and reserved is None and job.devices_needed:
                reserved = _shared_reservation(job, pool, placements, now)
        else:
            shadow, devices = reserved
            avoid = frozenset() if now + job.estimate <= shadow else devices
            placement = pool.take(job, isolate, avoid)
            passed += placement is None
        if placement is not None:
            queue.pop_job(job)
            placements.append(placement)
            held.took(job, now)
    return placements


def _shared_reservation(
    job: Job, pool: Pool, placed: list[Placement], now: float
) -> tuple[float, frozenset[int]]:
    """When and on which devices the job could start, from the running jobs' estimates."""
    memory = pool.memory_of(job)
    on: dict[int, list[tuple[float, int | None]]] = {}
    for run in pool.running:
        for device in run.devices:
            on.setdefault(device, []).append((run.expected_end(now), pool.memory_of(run.job)))
    for placement in placed:
        end = now + placement.job.estimate
        for device in placement.devices:
            on.setdefault(device, []).append((end, pool.memory_of(placement.job)))
    domain = pool.free | set(pool.shared) | pool.held_back | set(on)
    ready = sorted(
        (_ready_at(on.get(d, []), memory, pool.capacity.get(d, 0), now), d) for d in domain
    )
    k = job.devices_needed
    if len(ready) < k or ready[k - 1][0] == math.inf:
        # Devices held by other runs: no time promise can be made. Still protect the
        # waiting job: backfill only what ends before everything of ours has ended.
        last = max((end for jobs in on.values() for end, _ in jobs), default=now)
        return last, frozenset(domain)
    return ready[k - 1][0], frozenset(d for _, d in ready[:k])


def _ready_at(
    jobs: list[tuple[float, int | None]], memory: int | None, capacity: int, now: float
) -> float:
    """When a device has room: no jobs at all for a whole-device job, memory for a shared one."""
    if memory is None:
        return max((end for end, _ in jobs), default=now)
    used = sum(capacity if held is None else held for _, held in jobs)
    if capacity - used >= memory:
        return now
    for end, held in sorted(jobs, key=lambda entry: entry[0]):
        used -= capacity if held is None else held
        if capacity - used >= memory:
            return end
    return math.inf
