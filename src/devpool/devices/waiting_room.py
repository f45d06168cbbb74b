"""Fair sharing of one host's devices between concurrent runs.

A run that waits for devices other runs hold says so with a small file in the lock
folder's `waiting/` subfolder (its session, pid, platform, since when, how many devices
its first blocked job needs). Every run reads those files and holds at most a fair
share of the pool while others wait: ceil(pool / runs). When the longest-waiting run
needs more than a share (an 8-device test), the others make room for it, so no run
starves and no two runs deadlock on big jobs.

Any user may write in `waiting/`: its files are read as untrusted input
(devices/untrusted.py). A waiter file nobody rewrote for WAITER_STALE seconds has expired,
one of this host must name a live process of the file's owner, and no claim counts for
more than the pool.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from devpool.devices.untrusted import (
    OPEN_FLAGS,
    PID_MAX,
    Untrusted,
    first_line_json,
    folder_problem,
    integer,
    moment,
    read_file,
    text,
)

_FOLDER_MODE = 0o1777
REFRESH = 30.0  # seconds between rewrites of a waiting run's file
WAITER_STALE = 120.0  # seconds after which a file nobody rewrote no longer counts
WANTS_LIMIT = 1 << 20  # a claim beyond any host; the pool caps it further (fair_limit)
NAMES_LIMIT = 4096  # waiter files read at most, however many were planted
Say = Callable[[str], None]


@dataclass(frozen=True)
class Waiter:
    """One run waiting for devices held by others."""

    session: str
    pid: int
    host: str
    platform: str
    since: float  # time.time() when its wait began
    wants: int  # devices its first blocked job needs

    @classmethod
    def from_record(cls, record: dict[str, Any], path: Path) -> Waiter:
        """A waiter file's record, every field checked (Untrusted says which is wrong)."""
        return cls(
            session=text(record, "session", path),
            pid=integer(record, "pid", 1, PID_MAX, path),
            host=text(record, "host", path),
            platform=text(record, "platform", path),
            since=moment(record, "since", path),
            wants=integer(record, "wants", 1, WANTS_LIMIT, path),
        )


class Room(Protocol):
    """Where the runs sharing devices say they wait: a host's lock folder (WaitingRoom), a
    Ray cluster's store (backends/ray/waiting.py)."""

    def wait(self, waiter: Waiter | None) -> None: ...

    def others(self, platform: str) -> list[Waiter]: ...


class WaitingRoom:
    """The `waiting/` folder beside the lock files. A damaged or hostile entry is skipped
    with one line naming it; a folder that cannot be trusted, said once, is not used."""

    def __init__(self, lock_dir: Path, session: str, say: Say | None = None) -> None:
        self.path = lock_dir / "waiting"
        self.session = session
        self.say = say or _to_stderr
        self._mine: Waiter | None = None
        self._written = 0.0  # time.time() of our file's last write
        self._said: set[str] = set()  # files the warnings named, each once
        # Why this run cannot use the folder: then it neither says that it waits nor reads
        # who does, and holds no fair share back.
        self.problem: str | None = None
        try:
            os.mkdir(self.path, _FOLDER_MODE)
            os.chmod(self.path, _FOLDER_MODE, follow_symlinks=False)
        except FileExistsError:
            pass
        except OSError as exc:
            self.problem = f"{self.path} cannot be created: {exc.strerror or exc}"

    def usable(self) -> bool:
        """The folder is one every run may write and nobody can swap; said once if not."""
        problem = self.problem or folder_problem(self.path, any_owner=True)
        if problem is None:
            return True
        if problem not in self._said:
            self._said.add(problem)
            self.problem = problem
            self.say(f"{problem}; this run does without fair sharing between runs")
        return False

    def _file(self, session: str) -> Path:
        return self.path / f"{session}.json"

    def wait(self, waiter: Waiter | None) -> None:
        """Say that this run waits (or, with None, that it no longer does); a waiter's file
        is rewritten now and then, so that readers can tell that it is alive."""
        if waiter == self._mine and (waiter is None or time.time() - self._written < REFRESH):
            return
        self._mine = waiter
        target = self._file(self.session)
        if waiter is None:
            with contextlib.suppress(OSError):
                target.unlink()
            return
        if not self.usable():
            return
        temporary = self.path / f".{self.session}.{secrets.token_hex(6)}.tmp"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | OPEN_FLAGS
            with os.fdopen(os.open(temporary, flags, 0o644), "w") as handle:
                json.dump(asdict(waiter), handle)
            os.replace(temporary, target)  # readers never see half a file
            self._written = time.time()
        except OSError as exc:
            with contextlib.suppress(OSError):
                temporary.unlink()
            self._warn(target.name, f"{target}: it cannot be written ({exc.strerror or exc})")

    def others(self, platform: str) -> list[Waiter]:
        """Live runs other than this one that wait for devices of this platform."""
        if not self.usable():
            return []
        waiters = read_waiters(self.path, self._warn, remove_dead=True)
        return [w for w in waiters if w.session != self.session and w.platform == platform]

    def _warn(self, name: str, line: str) -> None:
        if name not in self._said:
            self._said.add(name)
            self.say(f"skipping {line}")


def read_waiters(
    folder: Path, warn: Callable[[str, str], None], *, remove_dead: bool = False
) -> list[Waiter]:
    """The live waiters of a `waiting/` folder, the longest-waiting first. What is damaged
    or hostile is skipped, with `warn(file name, one line)`; a run of this host that died is
    skipped (its file removed, with remove_dead); a file not rewritten for WAITER_STALE
    seconds has expired."""
    try:
        names = sorted(name for name in os.listdir(folder) if name.endswith(".json"))
    except OSError:
        return []
    host, now = socket.gethostname(), time.time()
    found = []
    for name in names[:NAMES_LIMIT]:
        path = folder / name
        try:
            read = read_file(path)
            waiter = Waiter.from_record(first_line_json(read.data, path), path)
        except Untrusted as exc:
            warn(name, str(exc))
            continue
        if now - read.mtime > WAITER_STALE:
            continue  # nobody rewrote it: its run is gone, or it was never a run
        if waiter.host == host and not _alive(waiter.pid, read.uid):
            if remove_dead:
                with contextlib.suppress(OSError):
                    path.unlink()  # a run that died while waiting (another user's stays)
            continue
        found.append(waiter)
    return sorted(found, key=lambda w: w.since)


def _alive(pid: int, uid: int) -> bool:
    """A live process that the file's owner runs (root may speak for anyone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except (OverflowError, OSError):
        return False
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return True  # no /proc here: the pid is all there is to go by
    return uid in (0, owner)


def _to_stderr(line: str) -> None:
    print(f"devpool: {line}", file=sys.stderr)


def fair_limit(pool: int, mine: Waiter | None, others: Sequence[Waiter]) -> int | None:
    """Most devices this run may hold now; None when it need not hold back. No run's claim
    counts for more than the pool it shares."""
    if not others:
        return None
    others = [replace(w, wants=min(w.wants, pool)) for w in others]
    share = math.ceil(pool / (len(others) + 1))
    oldest = min(others, key=lambda w: w.since)
    if mine is not None and mine.since <= oldest.since:
        # This run has waited longest. Only a job bigger than a share may take more.
        return None if mine.wants > share else share
    if oldest.wants > share:
        return max(0, pool - oldest.wants)  # make room for the big job waiting longest
    return share
