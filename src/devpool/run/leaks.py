"""The controller's side of clean hand-over: leaks the workers name, and what no worker can.

A worker ends what its test left and says so (worker/leaks.py); here each such leak gets its
LEAK line and its run-record line, and a worker that cannot be made clean again is retired.
What a worker could not see is swept here, by the run's mark (devices/leftovers.py): after a
worker died (a crash, a timeout's SIGKILL: its orphans outlive it) and before its devices
go to another test, and once more at the run's end. A guard process does the same if this
process is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from devpool.devices import leftovers
from devpool.report.record import LeakLine
from devpool.run.attempts import Attempt
from devpool.run.context import RunContext


class Leaks:
    """Leak lines, records and sweeps for one run."""

    def __init__(self, ctx: RunContext, say: Callable[[str], None], local: bool) -> None:
        self.ctx = ctx
        self.say = say
        self.mode = ctx.settings.leaks
        self.count = 0
        self.stuck: set[int] = set()  # devices a process we may not end still sees
        self._guard: subprocess.Popen[bytes] | None = None
        self._guard_fd = -1
        self.run: leftovers.RunMark | None = None
        mark = leftovers.this_run()
        if self.mode != "off" and local:
            self.run = leftovers.RunMark.of(mark, os.getpid())
            self._start_guard(mark)

    def _start_guard(self, mark: str) -> None:
        """The guard outlives a SIGKILL of this process and ends what carries the mark."""
        read, write = os.pipe()
        try:
            self._guard = subprocess.Popen(
                [sys.executable, "-I", "-S", leftovers.__file__, mark, str(os.getpid()), str(read)],
                pass_fds=(read,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._guard_fd = write
        except OSError:
            os.close(write)
        finally:
            os.close(read)

    def reported(
        self, attempt: Attempt | None, message: dict[str, Any], devices: list[int]
    ) -> None:
        """A leak a worker found and ended (or could not)."""
        nodeid = attempt.display if attempt is not None else str(message.get("nodeid", ""))
        self.tell(attempt, nodeid, message, devices)

    def tell(
        self, attempt: Attempt | None, nodeid: str, message: dict[str, Any], devices: list[int]
    ) -> None:
        self.count += 1
        fields = {
            k: message.get(k)
            for k in ("kind", "pid", "command", "user", "holds", "fixture", "ended")
        }
        event = {
            "job": attempt.job.id if attempt is not None else -1,
            "nodeid": nodeid,
            "attempt": attempt.number if attempt is not None else 0,
            "devices": devices,
            "mode": self.mode,
            **fields,
        }
        self.ctx.emit("leak", **event)
        self.say(f"LEAK {nodeid}: {LeakLine.of(event).what()}")
        if message.get("ended") == "not permitted":
            self.stuck.update(devices)
            self.say(
                f"LEAK {nodeid}: pid {message.get('pid')} (user {message.get('user')}) may not be "
                "ended by this run: the devices it sees are not handed to another test"
            )

    def take_stuck(self) -> list[int]:
        """Devices not to hand out again this run (retired by the loop), once each."""
        stuck, self.stuck = sorted(self.stuck), set()
        return stuck

    def sweep(self, attempt: Attempt | None, devices: list[int]) -> None:
        """End the run's processes that no live process of it owns any more (a dead worker's
        orphans); name each, charged to the test its environment names, else to attempt."""
        if self.run is None:
            return
        spare = [self._guard.pid] if self._guard is not None else []
        found = leftovers.orphans(self.run, spare)
        if not found:
            return
        described = [leftovers.describe(p) for p in found]
        how = leftovers.end(found)
        for proc, left in zip(found, described, strict=False):
            nodeid = left.environ.get("DEVPOOL_TEST_ID") or (
                attempt.display if attempt is not None else "(the run)"
            )
            holds = left.holds({"DEVPOOL_PLATFORM": self.ctx.inventory.platform.name})
            message = {
                "kind": "process",
                "pid": proc.pid,
                "command": left.command,
                "user": left.user,
                "holds": holds,
                "fixture": None,
                "ended": how.get(proc.pid, ""),
            }
            charged = attempt if attempt is not None and attempt.display == nodeid else None
            self.tell(charged, nodeid, message, devices)

    def close(self) -> None:
        """The run ended: a last sweep, then the guard is told it may go without one."""
        with contextlib.suppress(Exception):
            self.sweep(None, [])
        if self._guard_fd >= 0:
            with contextlib.suppress(OSError):
                os.write(self._guard_fd, b"done")
            os.close(self._guard_fd)
            self._guard_fd = -1
        if self._guard is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._guard.wait(5)
