"""The controller's handle on one job's ranks: a worker to the loop, n actors on the cluster."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devpool.backends import WorkerHandle
from devpool.devices.leases import Lease
from devpool.worker import protocol, wire
from devpool.worker.stacks import stacks_file

if TYPE_CHECKING:  # the rank actors' side imports no merge (nor pytest)
    from devpool.backends.failfast import FailFast


@dataclass
class RankActor:
    """One rank of a worker: its actor and what it reported about itself."""

    rank: int
    actor: Any
    node_id: str = ""
    address: str = ""
    pid: int = 0
    devices: list[int] = field(default_factory=list)
    log: Path | None = None  # its log on the controller's side
    code: int | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.address,
            "node_id": self.node_id,
            "devices": self.devices,
            "pid": self.pid,
            "log": str(self.log) if self.log is not None else "",
        }


@dataclass(eq=False)
class RayWorker(WorkerHandle):
    """A job's ranks on the cluster, seen by the controller as one worker."""

    key: int
    devices: tuple[int, ...]
    world: int
    log: Path
    fd_out: int
    lease: Lease | None = None
    reader: wire.Reader = field(default_factory=wire.Reader)
    exited: bool = False
    lost: str | None = None
    ranks: list[RankActor] = field(default_factory=list)
    placement_group: Any = None
    code: int | None = None
    finished: threading.Event = field(default_factory=threading.Event)
    stop_asked: threading.Event = field(default_factory=threading.Event)
    running: bool = False  # the rank processes are started: send() goes straight to them
    placed: bool = False  # Ray placed its actors (until then it waits for other runs' share)
    asked: float = 0.0  # time.monotonic() it asked Ray for its placement
    waiting_commands: list[protocol.Message] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    kind: str = ""  # its ranks fork from their nodes' templates of this kind ("": fresh)
    stopping: bool = False  # told to stop: ranks that end now end as asked
    fate: FailFast | None = None  # the fail-fast rules' view, set by the backend's pump

    @property
    def spent(self) -> bool:
        """It takes no more work: one rank's ending ended the others."""
        return self.fate is not None and self.fate.fallen is not None

    @property
    def ended_by(self) -> str | None:
        """Which rank died under the test, and how (the loop's crash detail)."""
        return self.fate.ended_by if self.fate is not None else None

    @property
    def pid(self) -> int:
        """Rank 0's worker pid on its node (0 until it started)."""
        return self.ranks[0].pid if self.ranks else 0

    @property
    def stacks(self) -> Path:
        return stacks_file(self.log)

    @property
    def rank_info(self) -> list[dict[str, Any]]:
        return [rank.describe() for rank in self.ranks if rank.node_id]

    def send(self, message: protocol.Message) -> bool:
        """Send a command to every rank; held back until the ranks have started."""
        if self.finished.is_set():
            return False
        if isinstance(message, protocol.Stop):
            self.stopping = True
        with self.lock:
            if not self.running:
                self.waiting_commands.append(message)
                if isinstance(message, protocol.Stop):
                    self.stop_asked.set()
                return True
            data = protocol.encode(message)
            for rank in self.ranks:
                rank.actor.send.remote(data)
        return True

    def signal_group(self, signum: int) -> None:
        """Signal every rank's process group; before the ranks started, a kill stops the start."""
        if signum in (signal.SIGTERM, signal.SIGKILL):
            self.stop_asked.set()
        if self.finished.is_set():
            return
        with self.lock:
            for rank in self.ranks:
                with contextlib.suppress(Exception):
                    rank.actor.signal.remote(signum, True)

    def dump_stacks(self) -> None:
        """Ask every rank's faulthandler for its stacks (SIGUSR1 to the worker process)."""
        with self.lock:
            for rank in self.ranks:
                with contextlib.suppress(Exception):
                    rank.actor.signal.remote(int(signal.SIGUSR1), False)

    def poll(self) -> int | None:
        return self.code if self.finished.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self.finished.wait(timeout):
            raise subprocess.TimeoutExpired(f"ray worker {self.key}", timeout or 0.0)
        assert self.code is not None
        return self.code

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd_out)
