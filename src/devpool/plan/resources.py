"""EASY reservations of named host resources, for the backfill policy.

Devices get one reservation per pass (policies/backfill.py); named resources get one per
resource: the first job in priority order that wants more units of a resource than are
free reserves them from when the running jobs' estimates free enough. A job behind it
that needs that resource starts only if it ends before then, or if it takes only units
the reserved job will not need. A stream of short ``resources(hccl=1)`` tests thus never
starves a ``resources(hccl=2)`` one.
"""

from __future__ import annotations

from collections.abc import Sequence

from devpool.plan.jobs import Job
from devpool.plan.scheduler import Placement, Pool


class ResourceReservations:
    """The reservations of one scheduling pass: resource name → (when, spare units then)."""

    def __init__(self) -> None:
        self.shadow: dict[str, tuple[float, int]] = {}

    def blocked(self, job: Job, pool: Pool, placed: Sequence[Placement], now: float) -> bool:
        """True when the job's resources are not free now; the first such job reserves them."""
        if pool.resources_fit(job):
            return False
        for name, count in job.request.resources:
            if name not in self.shadow and pool.resources.get(name, 0) < count:
                self.shadow[name] = _reservation(name, count, pool, placed, now)
        return True

    def allows(self, job: Job, now: float) -> bool:
        """The job may start without delaying any reservation of the resources it holds."""
        for name, count in job.request.resources:
            if name in self.shadow:
                when, spare = self.shadow[name]
                if now + job.estimate > when and count > spare:
                    return False
        return True

    def took(self, job: Job, now: float) -> None:
        """A job started: units it holds past a reservation come out of the spare ones."""
        for name, count in job.request.resources:
            if name in self.shadow:
                when, spare = self.shadow[name]
                if now + job.estimate > when:
                    self.shadow[name] = (when, spare - count)


def _reservation(
    name: str, count: int, pool: Pool, placed: Sequence[Placement], now: float
) -> tuple[float, int]:
    """When ``count`` units of the resource will be free, and how many beyond them then."""
    ends = [
        (run.expected_end(now), dict(run.job.request.resources).get(name, 0))
        for run in pool.running
    ]
    ends += [(now + p.job.estimate, dict(p.job.request.resources).get(name, 0)) for p in placed]
    available = pool.resources.get(name, 0)
    moment = now
    for end, units in sorted(ends):
        if available >= count:
            break
        if units:
            available += units
            moment = end
    if available < count:
        # Held by other runs' jobs: no promise can be made; protect the waiting job.
        last = max((end for end, _ in ends), default=now)
        return last, 0
    return moment, available - count
