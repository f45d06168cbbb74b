"""Fair sharing of one host's devices between concurrent runs.

A run that waits for devices other runs hold says so with a small file in the lock
folder's `waiting/` subfolder (its session, pid, platform, since when, how many devices
its first blocked job needs). Every run reads those files and holds at most a fair
share of the pool while others wait: ceil(pool / runs). When the longest-waiting run
needs more than a share (an 8-device test), the others make room for it, so no run
starves and no two runs deadlock on big jobs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import stat
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from devpool.errors import DevpoolError

_FOLDER_MODE = 0o1777


@dataclass(frozen=True)
class Waiter:
    """One run waiting for devices held by others."""

    session: str
    pid: int
    host: str
    platform: str
    since: float  # time.time() when its wait began
    wants: int  # devices its first blocked job needs


class Room(Protocol):
    """Where the runs sharing devices say they wait: a host's lock folder (WaitingRoom), a
    Ray cluster's store (backends/ray/waiting.py)."""

    def wait(self, waiter: Waiter | None) -> None: ...

    def others(self, platform: str) -> list[Waiter]: ...


class WaitingRoom:
    """The `waiting/` folder beside the lock files."""

    def __init__(self, lock_dir: Path, session: str) -> None:
        self.path = lock_dir / "waiting"
        self.session = session
        self._mine: Waiter | None = None
        if not self.path.is_dir():
            try:
                os.mkdir(self.path, _FOLDER_MODE)
                os.chmod(self.path, _FOLDER_MODE, follow_symlinks=False)
            except FileExistsError:
                pass
            except OSError as exc:
                raise DevpoolError(f"lock folder {lock_dir} is not writable: {exc}") from None
        if stat.S_ISLNK(os.lstat(self.path).st_mode):
            raise DevpoolError(f"{self.path} is a symlink; refusing to use it")

    def _file(self, session: str) -> Path:
        return self.path / f"{session}.json"

    def wait(self, waiter: Waiter | None) -> None:
        """Say that this run waits (or, with None, that it no longer does)."""
        if waiter == self._mine:
            return
        self._mine = waiter
        target = self._file(self.session)
        if waiter is None:
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
            return
        temporary = target.with_suffix(".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as handle:
            json.dump(asdict(waiter), handle)
        os.replace(temporary, target)  # readers never see half a file

    def others(self, platform: str) -> list[Waiter]:
        """Live runs other than this one that wait for devices of this platform."""
        found = []
        host = socket.gethostname()
        for entry in self.path.glob("*.json"):
            try:
                waiter = Waiter(**json.loads(entry.read_text(encoding="utf-8")))
            except (OSError, ValueError, TypeError):
                continue
            if waiter.session == self.session or waiter.platform != platform:
                continue
            if waiter.host == host and not _alive(waiter.pid):
                with contextlib.suppress(OSError):
                    entry.unlink()  # a run that died while waiting
                continue
            found.append(waiter)
        return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fair_limit(pool: int, mine: Waiter | None, others: Sequence[Waiter]) -> int | None:
    """Most devices this run may hold now; None when it need not hold back."""
    if not others:
        return None
    share = math.ceil(pool / (len(others) + 1))
    oldest = min(others, key=lambda w: w.since)
    if mine is not None and mine.since <= oldest.since:
        # This run has waited longest. Only a job bigger than a share may take more.
        return None if mine.wants > share else share
    if oldest.wants > share:
        return max(0, pool - oldest.wants)  # make room for the big job waiting longest
    return share
