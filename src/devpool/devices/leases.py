"""A lease on devices of one host, whole or by memory: what both kinds hold, and their files.

One ``flock`` per device file in a lock folder (lockdir.py takes them). The kernel drops an
``flock`` when the last descriptor of its open file description is closed, so a lease ends
even when every process holding it is SIGKILLed. Each lock file also carries a JSON record
of its last holder, for error messages and ``devpool locks``. Lock files are never deleted:
unlinking a file that another process is about to lock would let two processes lock two
different files of the same name.

A device can also be held in part, by memory (the mechanics are in shares.py): partial
holders hold a shared flock on the device file, so they and an exclusive holder exclude
each other, and each keeps one share record file, locked for as long as it holds, that
says how much it holds. Either way the holder gets a ``Lease``, or the ``Blocked`` devices
in the way; whole-device locking (lockdir.py) and shares both build on this module alone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import getpass
import json
import os
import re
import socket
import stat
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Protocol

from devpool.devices.untrusted import (
    PID_MAX,
    Untrusted,
    first_line_json,
    integer,
    moment,
    read_fd,
)
from devpool.devices.untrusted import text as untrusted_text
from devpool.errors import DevpoolError

LOCK_NAME = re.compile(r"^(?P<platform>.+)-(?P<device>0|[1-9][0-9]*)\.lock$")
_FILE_MODE = 0o666
_RECORD_LIMIT = 64 * 1024
# O_NONBLOCK keeps open() from hanging if someone planted a FIFO at a lock path.
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def _login_name() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return str(os.getuid())


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: the record written into each of its lock files."""

    pid: int
    host: str
    session: str
    job: str
    since: float
    user: str
    worker_pid: int | None = None

    @classmethod
    def for_this_process(cls, session: str, job: str = "") -> Holder:
        """A holder record for the calling process, starting now."""
        return cls(
            pid=os.getpid(),
            host=socket.gethostname(),
            session=session,
            job=job,
            since=time.time(),
            user=_login_name(),
        )

    def describe(self, tests: Sequence[str] | None = None) -> str:
        """One line for humans: pid, user, session, test (or `tests`) and start time."""
        where = "" if self.host == socket.gethostname() else f" on {self.host}"
        tests = [self.job] if tests is None and self.job else list(tests or ())
        doing = f"test{'s' if len(tests) > 1 else ''} {', '.join(tests)}" if tests else "idle"
        return (
            f"pid {self.pid}{where} (user {self.user}, session {self.session}, "
            f"{doing}, since {_clock(self.since)})"
        )

    def to_json(self) -> str:
        """The record as one line of JSON."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Holder | None:
        """Parse a record written by ``to_json``; None for empty or malformed text. Any user
        can write a lock file's record: every field is checked for its type and range."""
        where = Path("holder record")
        try:
            record = first_line_json(text.encode(), where)
            worker_pid = record.get("worker_pid")
            return cls(
                pid=integer(record, "pid", 0, PID_MAX, where),
                host=untrusted_text(record, "host", where),
                session=untrusted_text(record, "session", where),
                job=untrusted_text(record, "job", where),
                since=moment(record, "since", where),
                user=untrusted_text(record, "user", where),
                worker_pid=None
                if worker_pid is None
                else integer(record, "worker_pid", 0, PID_MAX, where),
            )
        except Untrusted:
            return None


def _clock(since: float) -> str:
    moment = time.localtime(since)
    if time.strftime("%Y-%m-%d", moment) == time.strftime("%Y-%m-%d"):
        return time.strftime("%H:%M:%S", moment)
    return time.strftime("%Y-%m-%d %H:%M:%S", moment)


@dataclass(frozen=True)
class Share:
    """A partial hold of one device: who holds it and how many bytes of its memory."""

    holder: Holder | None  # None when the record is unreadable
    amount: int

    def describe(self) -> str:
        """'8 GiB by pid 42 (user ..., test ..., since ...)'."""
        from devpool.devices.sizes import format_size

        who = self.holder.describe() if self.holder else "an unknown holder"
        return f"{format_size(self.amount)} by {who}"


@dataclass(frozen=True)
class Blocked:
    """A device that another lease holds; holder is None when its record is unreadable.

    When partial holders are in the way, ``shares`` lists them and ``free`` is what they
    leave of the device's memory (for a memory request that did not fit).
    """

    device: int
    holder: Holder | None
    shares: tuple[Share, ...] = ()
    free: int | None = None
    unusable: str | None = None  # why its lock file cannot be used (planted): not waited for


def describe_blockers(platform: str, blocked: Sequence[Blocked]) -> str:
    """One line naming every busy device and who holds it."""
    from devpool.devices.sizes import format_size

    parts = []
    for item in blocked:
        if item.shares:
            left = f" ({format_size(item.free)} left)" if item.free is not None else ""
            held = ", ".join(share.describe() for share in item.shares)
            parts.append(f"{platform}:{item.device} shared: {held}{left}")
            continue
        who = item.holder.describe() if item.holder else "an unknown holder"
        parts.append(f"{platform}:{item.device} held by {who}")
    return "; ".join(parts)


@dataclass
class _Handle:
    device: int
    path: Path
    fd: int
    # False when the file belongs to another user and only opened read-only:
    # flock still works, but the holder record cannot be rewritten.
    writable: bool = True
    created: bool = False  # this open made the file


class Unusable(DevpoolError):
    """A lock file that cannot be used: another user planted a symlink, folder or FIFO, or
    a file this user may not open. The device is skipped, not waited for."""


class Attached(Protocol):
    """What a lease can hold beside its devices (resources.HostLease: ports, resource units)."""

    def fds(self) -> list[int]: ...

    def set_job(self, holder: Holder) -> None: ...

    def release(self, *, unlock: bool = True) -> None: ...


class Lease:
    """Hold of some devices of one platform, until released or every holder exits.

    Exclusive unless ``amount`` is set: then it holds that many bytes of each device's
    memory, shared with other partial holders (share records in ``_records``).
    """

    def __init__(
        self,
        platform: str,
        holder: Holder,
        handles: Sequence[_Handle],
        records: Sequence[_Handle] = (),
        amount: int | None = None,
        markers: Sequence[_Handle] = (),
    ) -> None:
        self.platform = platform
        self.devices: tuple[int, ...] = tuple(handle.device for handle in handles)
        self.holder = holder
        self.amount = amount
        self._handles = list(handles)
        self._records = list(records)
        # Held beside a lock file that another user could remove (lockdir.py): a run that
        # finds the file gone and makes a new one sees that the device is still held.
        self._markers = list(markers)
        self._released = False
        self.host: Attached | None = None  # ports and resources held with it (resources.py)

    def attach(self, host: Attached) -> None:
        """Hold ``host`` (a HostLease) with this lease: passed on and released together."""
        self.host = host

    @property
    def released(self) -> bool:
        """True once ``release`` ran."""
        return self._released

    def fds(self) -> list[int]:
        """The open lock descriptors (device files, then share records); pass them all to a
        worker to share the lease."""
        extra = self.host.fds() if self.host is not None else []
        return [handle.fd for handle in self._handles + self._records + self._markers] + extra

    def set_job(self, job: str, worker_pid: int | None = None) -> None:
        """Rewrite the holder record in every lock file for a new job or worker."""
        if self._released:
            raise RuntimeError(f"lease on {self.platform}:{self.devices} is already released")
        self.holder = replace(self.holder, job=job, worker_pid=worker_pid)
        if self.host is not None:
            self.host.set_job(self.holder)
        if self._records:
            for handle in self._records:
                _write_record(handle, self.holder, self.amount)
            return
        for handle in self._handles:
            _write_record(handle, self.holder)

    def release(self, *, unlock: bool = True) -> None:
        """Unlock and close every lock file; idempotent.

        With ``unlock=False`` only this process's descriptors are closed, so a worker that
        inherited them keeps the devices until it exits.
        """
        if self._released:
            return
        self._released = True
        handles, self._handles = self._handles, []
        records, self._records = self._records + self._markers, []
        self._markers = []
        if self.host is not None:
            self.host.release(unlock=unlock)
        for handle in records:
            if unlock:
                # Our own record, unique by name: nobody else can be about to lock it.
                with contextlib.suppress(OSError):
                    os.unlink(handle.path)
            _close(handle.fd, unlock=unlock)
        for handle in handles:
            _close(handle.fd, unlock=unlock)

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        if self.amount is not None:
            from devpool.devices.sizes import format_size

            state += f", {format_size(self.amount)} each"
        return f"Lease({self.platform}:{list(self.devices)}, {state}, {self.holder.describe()})"


def lock_path(folder: Path, platform: str, device: int) -> Path:
    """The lock file of one device: ``<folder>/<platform>-<device>.lock``."""
    if not platform or "/" in platform or platform in (".", "..") or "\0" in platform:
        raise DevpoolError(f"platform name {platform!r} cannot be used in a lock file name")
    if device < 0:
        raise ValueError(f"device id must be >= 0, got {device}")
    return folder / f"{platform}-{device}.lock"


def _open_lock_file(device: int, path: Path) -> _Handle:
    # Open an existing file without O_CREAT first: with fs.protected_regular, O_CREAT on
    # another user's file in a sticky world-writable folder fails even when its mode allows.
    for _ in range(10):
        try:
            return _checked(device, path, os.open(path, os.O_RDWR | _OPEN_FLAGS), True)
        except FileNotFoundError:
            pass
        except PermissionError:
            return _open_read_only(device, path)
        except OSError as exc:
            raise _open_error(path, exc) from None
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, _FILE_MODE)
        except FileExistsError:
            continue  # created (or replaced by a symlink) since we looked; look again
        except OSError as exc:
            raise _open_error(path, exc) from None
        with contextlib.suppress(PermissionError):
            os.fchmod(fd, _FILE_MODE)  # the umask narrowed it; other users must open it too
        return replace(_checked(device, path, fd, True), created=True)
    raise Unusable(f"lock file {path} keeps changing; cannot open it")


def _open_read_only(device: int, path: Path) -> _Handle:
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    except OSError as exc:
        raise _open_error(path, exc) from None
    return _checked(device, path, fd, False)


def _checked(device: int, path: Path, fd: int, writable: bool) -> _Handle:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Unusable(f"lock file {path} is not a regular file; refusing to use it")
    return _Handle(device, path, fd, writable)


def _open_error(path: Path, exc: OSError) -> DevpoolError:
    if exc.errno == errno.ELOOP:
        return Unusable(f"lock file {path} is a symlink; refusing to use it")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.ENXIO, errno.EISDIR, errno.EWOULDBLOCK):
        return Unusable(f"lock file {path} cannot be opened: {exc.strerror}")
    return DevpoolError(f"lock file {path} cannot be opened: {exc.strerror}")


def _write_record(handle: _Handle, holder: Holder, amount: int | None = None) -> None:
    if not handle.writable:
        return
    text = holder.to_json()
    if amount is not None:  # a share record: the holder and the bytes it holds
        text = json.dumps({**asdict(holder), "amount": amount}, sort_keys=True)
    data = (text + "\n").encode()
    # Write then truncate (not the reverse) so a concurrent reader never sees an empty
    # file; it reads up to the first newline, so a longer old tail cannot garble it.
    os.pwrite(handle.fd, data, 0)
    os.ftruncate(handle.fd, len(data))


def _read_record(fd: int) -> Holder | None:
    """The holder record of an open lock file; None unless it is a regular file that holds
    a whole, well-typed record (any user may have written it)."""
    try:
        raw = read_fd(fd, Path("lock file"), _RECORD_LIMIT).data
    except Untrusted:
        return None
    return Holder.from_json(raw.decode("utf-8", errors="replace").split("\n", 1)[0])


def _close_all(handles: Iterable[_Handle]) -> None:
    for handle in handles:
        _close(handle.fd, unlock=True)


def _close(fd: int, *, unlock: bool) -> None:
    try:
        if unlock:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
