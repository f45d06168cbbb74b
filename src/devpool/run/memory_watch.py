"""Device memory during a run: the watch on each shared test, and the retry alone.

A test of a memory lease is watched while it runs (NVML per process for cuda, the file a
sim test writes): one that uses more than it declared ends `failed`, saying by how much.
One that ran out of memory within its own declaration was crowded out by a neighbour: it
runs once more, alone on a whole device, and is not blamed. The loop (loop.py) holds one
MemoryWatches and tells it which tests start, report and run again alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from devpool.devices import memory
from devpool.devices.memory import MemoryWatch
from devpool.run.attempts import Attempt
from devpool.run.context import RunContext
from devpool.run.pool import Slot


class MemoryWatches:
    """The memory watches of running tests, and the jobs that ran again alone."""

    def __init__(
        self,
        ctx: RunContext,
        where: Callable[[tuple[int, ...]], str],
        say: Callable[[str], None],
    ) -> None:
        self.ctx = ctx
        self.platform = ctx.inventory.platform
        self.where = where  # 'sim:0,1' for a tuple of devices (the replay's)
        self.say = say
        self.watches: dict[int, MemoryWatch] = {}  # worker key → its running test's watch
        self.alone: set[int] = set()  # jobs run again alone after running out of memory

    @property
    def watching(self) -> bool:
        """Any running test is watched."""
        return bool(self.watches)

    def run_alone(self, job_id: int) -> None:
        """The job runs again alone on a whole device: out of memory again is its own."""
        self.alone.add(job_id)

    def watch(self, slot: Slot, attempt: Attempt) -> None:
        """A test of a memory lease started: watch what it uses on its devices."""
        declared = attempt.job.memory_needed
        if not self.ctx.memory or not declared:
            return
        self.watches[slot.key] = MemoryWatch(
            self.platform.name,
            self.platform.kind,
            slot.worker.devices,
            declared,
            sim_file=slot.memory_file,
            pids=[slot.worker.pid],
        )

    def overran(self, slot: Slot, attempt: Attempt) -> bool:
        """Look at a watched test's memory once; an overrun fails it (said in attempt.overrun)."""
        watch = self.watches.get(slot.key)
        if watch is None or attempt.overrun:
            return bool(attempt.overrun)
        found = watch.poll()
        attempt.peak_memory = dict(watch.peak)
        if found is not None:
            attempt.overrun = found.describe()
            slot.dirty = True
        return found is not None

    def out_of_memory_beside(self, attempt: Attempt, data: dict[str, Any]) -> bool:
        """A test of a shared device ran out of memory within its own declaration: a
        neighbour took the rest. It runs once more, alone, and is not blamed for it."""
        job = attempt.job
        if not self.ctx.memory or not job.memory_needed or attempt.overrun:
            return False
        if job.id in self.alone:
            return False
        text = f"{data.get('longrepr')}\n{data.get('sections')}"
        if not memory.ran_out(text):
            return False
        note = (
            f"{self.where(attempt.devices)}: {attempt.display} ran out of memory beside "
            "other tests, within what it declared; retried alone on a whole device"
        )
        self.ctx.device_notes.append(note)
        self.ctx.emit("memory_retry", nodeid=attempt.display, devices=list(attempt.devices))
        self.say(note)
        return True

    def overrunning(self, slots: Iterable[Slot]) -> Iterator[Slot]:
        """Of the workers' slots, those whose running test now uses more memory than it
        declared: the loop ends each as it comes (its exit ends the attempt, `failed`)."""
        for slot in slots:
            attempt = slot.current
            if attempt is None:
                self.watches.pop(slot.key, None)
            elif not attempt.overrun and self.overran(slot, attempt):
                yield slot
