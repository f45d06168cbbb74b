"""Where workers run: child processes on this host (local), or Ray actors across a cluster.

Every backend hands the controller the same two things: workers it can message, signal
and wait for, and one poll over all their event streams. The controller never knows
which backend it drives, except whether it must take local device leases.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # a Ray rank actor imports this package: pytest stays out of it
    from devpool.devices.leases import Lease
    from devpool.devices.waiting_room import Room
    from devpool.plan.markers import Request
    from devpool.worker.protocol import Message


class WorkerHandle:
    """One worker: a pytest process bound to its devices, wherever it runs.

    Every member the run loop uses is here; those only some workers have (a rank group's,
    a remote worker's) default to what an ordinary local worker does or says."""

    key: int
    devices: tuple[int, ...]
    lease: Lease | None
    log: Path  # its stdout/stderr, readable from the controller
    exited: bool
    lost: str | None = None  # its machine went away (a remote worker): why
    fresh_since: float | None = None  # a fork that became a fresh interpreter, from then

    @property
    def pid(self) -> int:
        raise NotImplementedError

    @property
    def stacks(self) -> Path:
        raise NotImplementedError

    def send(self, message: Message) -> bool:
        """Send a command; False when the worker is already gone."""
        raise NotImplementedError

    def signal_group(self, signum: int) -> None:
        raise NotImplementedError

    def poll(self) -> int | None:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> int:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def wait_or_kill(self, seconds: float) -> int:
        """Its exit status within seconds, else once SIGKILL to its whole group ended it."""
        try:
            return self.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            return self.wait()

    @property
    def spent(self) -> bool:
        """It takes no more work (a rank group one rank's ending ended)."""
        return False

    @property
    def ended_by(self) -> str | None:
        """Which rank died under the test, and how (a rank group's crash detail)."""
        return None

    @property
    def rank_info(self) -> list[dict[str, Any]]:
        """Each rank's pid, devices, log (and node), for the run record; [] for one process."""
        return []

    def dump_stacks(self) -> None:
        """Ask its faulthandler for every thread's stack (SIGUSR1; written to `stacks`)."""
        if self.pid > 0:  # 0: a fork not made yet (never os.kill(0, ...))
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGUSR1)

    def reached(self, nodeid: str) -> set[str]:
        """The phases of a test it has reported that the loop has not seen yet (a rank group
        holds its ranks' reports until every rank finished)."""
        return set()

    def rank_output(self) -> str | None:
        """Each rank's output since the current test started, labelled; None for one process
        (its log is read from the attempt's offset)."""
        return None


class Backend:
    """Starts workers and multiplexes their events."""

    local_leases: bool  # True: the controller leases devices on this host before start()
    groups_ranks = False  # True: a multi-rank test's ranks start one by one, then group()

    def start(
        self,
        devices: tuple[int, ...],
        lease: Lease | None,
        env: Mapping[str, str],
        request: Request | None = None,
    ) -> WorkerHandle:
        raise NotImplementedError

    def poll(self, timeout: float) -> list[tuple[WorkerHandle, list[Message], bool]]:
        raise NotImplementedError

    def drain(self, worker: WorkerHandle) -> list[Message]:
        raise NotImplementedError

    def reap(self, worker: WorkerHandle, wait: float = 5.0) -> int | None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def group(self, workers: list[WorkerHandle], shape: int, straggle: float) -> WorkerHandle:
        """One multi-rank test's workers (rank order) as one worker (groups_ranks only)."""
        raise NotImplementedError

    def forks(self) -> Forks | None:
        """Its fork server, when workers can fork from templates that collected already."""
        return None

    def waiting_room(self, session: str) -> Room | None:
        """Where the runs sharing its devices say they wait (None: the host's lock folder)."""
        return None

    def unsatisfiable(self, request: Request) -> str | None:
        """Why no placement it can make would ever hold the request (None: it can be held;
        on a host, the plan's inventory already said so)."""
        return None

    def unplaced(self, now: float) -> dict[int, float]:
        """Sizes of workers it could not place for a while, and since when (monotonic):
        other runs hold what they need."""
        return {}


@runtime_checkable
class Forks(Protocol):
    """A backend that can fork a worker from a template that has collected already."""

    def fork(
        self,
        kind: str,
        template_env: Mapping[str, str],
        devices: tuple[int, ...],
        lease: Lease | None,
        env: Mapping[str, str],
        start: bool = True,
        request: Request | None = None,
    ) -> WorkerHandle | None: ...

    def prepare(self, kind: str, template_env: Mapping[str, str]) -> None: ...

    def template_state(self, kind: str) -> str | None: ...

    def template_started(self, kind: str) -> float | None: ...

    def covers(self, kind: str, modules: frozenset[str]) -> bool: ...

    def discard(self, kind: str) -> None: ...

    def check(self, now: float) -> None: ...

    def due(self) -> list[float]: ...

    def notes(self) -> list[str]: ...

    def culprit(self, kind: str) -> tuple[str, str] | None:
        """(test module, why) when one module's import made the kind's template unsafe."""
        ...
