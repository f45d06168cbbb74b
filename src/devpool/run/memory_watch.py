"""Device memory during a run: the watch on each shared test, and the retry alone.

A test of a memory lease is watched while it runs (NVML per process for cuda, the file a
sim test writes): one that uses more than it declared ends `failed`, saying by how much.
One that ran out of memory within its own declaration was crowded out by a neighbour: it
runs once more, alone on a whole device, and is not blamed. Loop (loop.py) mixes it in.
"""

from __future__ import annotations

from typing import Any

from devpool.devices import memory
from devpool.devices.inventory import Platform
from devpool.devices.memory import MemoryWatch
from devpool.run.attempts import Attempt
from devpool.run.context import RunContext
from devpool.run.pool import Slot, WorkerPool
from devpool.run.replay import Replay


class MemoryGuard:
    """The memory watches of running tests; mixed into the loop."""

    ctx: RunContext
    platform: Platform
    pool: WorkerPool
    replay: Replay
    watches: dict[int, MemoryWatch]
    alone: set[int]

    def say(self, text: str) -> None:
        raise NotImplementedError  # the loop's

    def _watch(self, slot: Slot, attempt: Attempt) -> None:
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

    def _overran(self, slot: Slot, attempt: Attempt) -> bool:
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

    def _out_of_memory_beside(self, attempt: Attempt, data: dict[str, Any]) -> bool:
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
            f"{self.replay.where(attempt.devices)}: {attempt.display} ran out of memory beside "
            "other tests, within what it declared; retried alone on a whole device"
        )
        self.ctx.device_notes.append(note)
        self.ctx.emit("memory_retry", nodeid=attempt.display, devices=list(attempt.devices))
        self.say(note)
        return True

    def _watch_running(self) -> None:
        """Running tests that use more memory than they declared end now, `failed`."""
        for slot in list(self.pool.slots.values()):
            attempt = slot.current
            if attempt is None:
                self.watches.pop(slot.key, None)
            elif not attempt.overrun and self._overran(slot, attempt):
                self.pool.kill(slot)  # its exit ends the attempt with the overrun
