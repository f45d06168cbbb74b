"""First-in, first-out with head-of-line blocking: the baseline the benchmarks compare against."""

from __future__ import annotations

from devpool.plan.scheduler import Placement, Pool, Queue


class Fifo:
    """Start jobs strictly in queue order; the first job that does not fit blocks all behind it."""

    name = "fifo"

    def select(self, queue: Queue, pool: Pool, now: float, isolate_all: bool) -> list[Placement]:
        placements: list[Placement] = []
        for job in sorted(queue, key=lambda job: job.index):
            placement = pool.take(job, isolate_all or job.fresh)
            if placement is None:
                break
            queue.pop_job(job)
            placements.append(placement)
        return placements
