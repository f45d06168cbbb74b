"""Where workers run: child processes on this host (local), or Ray actors across a cluster.

Every backend hands the controller the same two things: workers it can message, signal
and wait for, and one poll over all their event streams. The controller never knows
which backend it drives, except whether it must take local device leases.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # a Ray rank actor imports this package: pytest stays out of it
    from devpool.devices.leases import Lease
    from devpool.plan.markers import Request
    from devpool.worker.protocol import Message


class WorkerHandle(Protocol):
    """One worker: a pytest process bound to its devices, wherever it runs."""

    key: int
    devices: tuple[int, ...]
    lease: Lease | None
    log: Path  # its stdout/stderr, readable from the controller
    exited: bool

    @property
    def pid(self) -> int: ...

    @property
    def stacks(self) -> Path: ...

    def send(self, message: Message) -> bool: ...

    def signal_group(self, signum: int) -> None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def close(self) -> None: ...


class Backend(Protocol):
    """Starts workers and multiplexes their events."""

    local_leases: bool  # True: the controller leases devices on this host before start()

    def start(
        self,
        devices: tuple[int, ...],
        lease: Lease | None,
        env: Mapping[str, str],
        request: Request | None = None,
    ) -> WorkerHandle: ...

    def poll(self, timeout: float) -> list[tuple[WorkerHandle, list[Message], bool]]: ...

    def drain(self, worker: WorkerHandle) -> list[Message]: ...

    def reap(self, worker: WorkerHandle, wait: float = 5.0) -> int | None: ...

    def close(self) -> None: ...


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
