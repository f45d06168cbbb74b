"""Batches: which queued jobs go to a worker with the one placed on it (placing.py's).

A worker is sent more than its placement's job: the small tests of the same size that
follow it in the queue, so that per-test messaging stays negligible; a chain's later tests
(pytest-order / -dependency); under --devpool-isolation module, the rest of the module. A
batch streams: its next part is sent while the worker still has tests of it to run.
"""

from __future__ import annotations

from collections.abc import Mapping

from devpool.plan.jobs import Job
from devpool.plan.scheduler import Scheduler
from devpool.run.attempts import Attempt, State
from devpool.run.context import RunContext
from devpool.run.pool import Slot

BATCH_SECONDS = 1.0  # estimated work sent to a worker at once, for small tests
BATCH_MAX = 64
UNKNOWN_SMALL = 0.1  # seconds assumed, for batching only, of a test with no history


class Batches:
    """Picks the jobs that go with a placed one, and a streaming batch's next part."""

    def __init__(
        self, ctx: RunContext, scheduler: Scheduler, attempts: Mapping[int, Attempt]
    ) -> None:
        self.ctx = ctx
        self.scheduler = scheduler
        self.attempts = attempts  # the loop's: job id → its current attempt

    def next_part(self, slot: Slot, stopped: bool) -> list[Job]:
        """The jobs to send a worker busy with a batch now, taken from the queue ([]: none
        yet, or none at all)."""
        head = slot.head
        if head is None or slot.stopping or slot.dirty or slot.killed_for is not None:
            return []
        if head.request.nodes > 1:
            return []  # the ranks of a multi-node worker end a batch together (backends/merge.py)
        unstarted = [a.job for a in slot.sent if a.state is State.SENT]
        if len(unstarted) * 2 > BATCH_MAX or sum(map(_small, unstarted)) * 2 > BATCH_SECONDS:
            return []  # enough left that the worker cannot run dry before the next look
        return self.after(head, stopped)

    def after(self, head: Job, stopped: bool) -> list[Job]:
        """More small jobs of the head's size for the same worker: per-test messaging stays
        negligible. Sized from expected durations, and never more than a fair part of what is
        left, so the end of the run stays balanced."""
        k = head.devices_needed
        settings = self.ctx.settings
        # --devpool-isolation module: a process runs the tests of one module and no other;
        # they go to it together (streamed in parts), whatever their size or duration.
        module = settings.isolation == "module"
        if head.chain is not None and head.chain[0] is head and not stopped:
            # pytest-order / -dependency: the rest of the chain, in order, in this worker.
            return [job for job in head.chain[1:] if self.attempts[job.id].state is State.QUEUED]
        if head.fresh or settings.isolation == "job" or stopped:
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


def _small(job: Job) -> float:
    """A job's expected seconds for batching; a test with no history is taken as small."""
    return job.estimate if job.estimate_known else UNKNOWN_SMALL
