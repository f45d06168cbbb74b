"""Jobs that end `infra` without ever starting here (placing.py's).

A job ends before it starts when no other run let it through in time (their leases, or
the fair share their waiting leaves us, past --devpool-lease-timeout), or when too few
healthy devices are left for it; the rest of its chain (pytest-order / -dependency) ends
with it. Each ending names why and, where other runs were in the way, who held what.
"""

from __future__ import annotations

from collections.abc import Mapping

from devpool.devices.lockdir import describe_holders
from devpool.outcomes import Outcome
from devpool.plan.jobs import Job
from devpool.plan.scheduler import Scheduler
from devpool.run.attempts import Attempt, State
from devpool.run.context import RunContext
from devpool.run.fair_share import FairShare
from devpool.run.health import Foreign
from devpool.run.pool import WorkerPool
from devpool.run.replay import Replay


class Unstarted:
    """Ends the jobs that will never start here, each with its reason."""

    def __init__(
        self,
        ctx: RunContext,
        scheduler: Scheduler,
        pool: WorkerPool,
        replay: Replay,
        foreign: Foreign,
        fair: FairShare,
        attempts: Mapping[int, Attempt],
    ) -> None:
        self.ctx = ctx
        self.platform = ctx.inventory.platform
        self.scheduler = scheduler
        self.pool = pool
        self.replay = replay
        self.foreign = foreign
        self.fair = fair
        self.attempts = attempts  # the loop's: job id → its current attempt

    def expire_lease_waits(self, now: float, blocked_since: dict[int, float]) -> None:
        """Jobs blocked by other runs' leases end `infra` after --devpool-lease-timeout."""
        busy = {d for run in self.scheduler.running.values() for d in run.devices}
        busy.update(self.pool.retiring())
        blocked = set(self.foreign.blocked)
        free = len(set(self.ctx.inventory.devices) - busy - blocked)
        timeout = self.ctx.settings.lease_timeout
        for head in self.scheduler.queue.heads():
            k = head.devices_needed
            if k == 0 or k <= free or not self.foreign:
                blocked_since.pop(k, None)
                continue
            since = blocked_since.setdefault(k, now)
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
            self.end(head, reason)

    def end(self, job: Job, reason: str) -> None:
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
                self.end(job, reason)

    def stalled_out(self, waited: float) -> None:
        """The whole queue waited past --devpool-lease-timeout with nothing of ours running
        (Placing.end_stall): each job ends `infra`, naming who held what then."""
        timeout = self.ctx.settings.lease_timeout
        holders = self.ctx.lock_dir.held_by_others(self.ctx.run_id)
        who = describe_holders(holders)
        if not who:
            waiters = self.fair.others()
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
