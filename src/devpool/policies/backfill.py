"""Priority order with EASY backfilling: small jobs fill gaps without delaying the first big one."""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from devpool.plan import Job
from devpool.scheduler import Placement, Pool, Queue

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
        placements: list[Placement] = []
        shadow: float | None = None  # when the reserved job is expected to start
        spare = 0  # devices free at that moment beyond what the reserved job needs
        skipped: dict[int, int] = {}
        for job in _walk(queue, pool):
            if pool.slots <= 0:
                break
            k = job.devices_needed
            if k > len(pool.free) or (k == 0 and pool.cpu_slots <= 0):
                if shadow is None and k > 0:
                    shadow, spare = _reservation(k, pool, placements, now)
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
            placement = pool.take(job, isolate_all or job.request.isolate)
            if placement is None:
                continue
            queue.pop_job(job)
            placements.append(placement)
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
