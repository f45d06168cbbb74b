"""Priority order with EASY backfilling: small jobs fill gaps without delaying the first big one."""

from __future__ import annotations

from devpool.scheduler import Placement, Pool, Queue


class Backfill:
    """Start jobs in priority order; a job that does not fit reserves the devices it waits for.

    Jobs behind it may start ("backfill") only if they end before that reservation, by
    their estimate, or use devices the reserved job will not need. This is EASY
    backfilling: the first waiting big job is never starved by a stream of small ones.
    """

    name = "backfill"

    def select(self, queue: Queue, pool: Pool, now: float, isolate_all: bool) -> list[Placement]:
        placements: list[Placement] = []
        shadow: float | None = None  # when the reserved job is expected to start
        spare = 0  # devices free at that moment beyond what the reserved job needs
        for head in queue.heads():
            size = head.devices_needed
            while pool.slots > 0 and queue.of_size_count(size):
                job = queue.peek(size)
                k = job.devices_needed
                fits = k <= len(pool.free) and (k > 0 or pool.cpu_slots > 0)
                if not fits:
                    if shadow is None and k > 0:
                        shadow, spare = _reservation(k, pool, now)
                    break
                if shadow is not None and k > 0:
                    ends_in_time = now + job.estimate <= shadow
                    if not ends_in_time and k > spare:
                        break
                    if not ends_in_time:
                        spare -= k
                placement = pool.take(job, isolate_all or job.request.isolate)
                if placement is None:
                    break
                queue.pop(size)
                placements.append(placement)
        return placements


def _reservation(k: int, pool: Pool, now: float) -> tuple[float, int]:
    """When k devices will be free given the running jobs' estimates, and how many spare then."""
    available = len(pool.free)
    moment = now
    for run in sorted(pool.running, key=lambda r: r.expected_end(now)):
        if available >= k:
            break
        available += len(run.devices)
        moment = run.expected_end(now)
    if available < k:  # devices held by other runs: no time promise can be made
        return float("inf"), 0
    return moment, available - k
