"""A lock file that another user could remove: markers that keep its device held.

The lock folder is sticky: only a lock file's owner can remove it. When it belongs to
another user (not root), that user could remove it while a run holds it, and the next run
would make a new file of that name and lock it too. So a whole holder of such a file also
holds a marker of its own, ``<platform>-<device>.held-<pid>-<random>``, locked for as long
as it holds the device (a partial holder's share record, shares.py, serves as its marker).
Every run that locks a device file, whole or in part, and whoever made that file, then:

1. makes and locks its own marker (or share record), where it needs one;
2. checks that the name still names the file it locked (not removed or replaced since);
3. looks for a marker (or, for a whole holder, a share record) another holder holds.

Of two runs that locked two different files of one name, the first file was removed
before the second was made. If the first run's step 2 came after the removal, it gives
up; if before, its marker was locked before the second run's step 3, which sees it. So
two holders are impossible, whatever the order; at worst both give up and try again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from pathlib import Path

from devpool.devices.leases import (
    _OPEN_FLAGS,
    Blocked,
    Holder,
    _close_all,
    _Handle,
    _write_record,
)
from devpool.devices.untrusted import Untrusted, read_fd

MARKERS_LIMIT = 256  # markers of one device looked at, however many were planted


def removable_by_others(handle: _Handle) -> bool:
    """Whether a user other than root and us owns the lock file (and so may remove it)."""
    try:
        owner = os.fstat(handle.fd).st_uid
    except OSError:
        return True
    return owner not in (0, os.geteuid())


def new_marker(folder: Path, platform: str, device: int, holder: Holder) -> _Handle:
    """A marker of our own, locked and holding our record (step 1)."""
    path = folder / f"{platform}-{device}.held-{os.getpid()}-{secrets.token_hex(6)}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, 0o644)
    handle = _Handle(device, path, fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh name: nobody else has it
        _write_record(handle, holder)
    except BaseException:
        drop_marker(handle)
        raise
    return handle


def drop_marker(handle: _Handle) -> None:
    """Remove and unlock a marker of ours (a lease that gave up, or ended)."""
    with contextlib.suppress(OSError):
        os.unlink(handle.path)
    _close_all([handle])


def successor_problem(
    folder: Path, platform: str, handle: _Handle, own: Path | None = None
) -> Blocked | None:
    """Steps 2 and 3, after locking ``handle`` and making our marker ``own`` (if any): what
    is in the way if the lock file was removed or replaced, or another holder's marker is
    held; None when the device is ours."""
    try:
        named, ours = os.lstat(handle.path), os.fstat(handle.fd)
    except OSError:
        return Blocked(handle.device, None)  # removed as we locked it: try again later
    if (named.st_dev, named.st_ino) != (ours.st_dev, ours.st_ino):
        return Blocked(handle.device, None)  # replaced as we locked it: try again later
    prefix = f"{platform}-{handle.device}.held-"
    try:
        names = [name for name in os.listdir(folder) if name.startswith(prefix)]
    except OSError:
        return Blocked(handle.device, None)  # cannot look: not ours yet
    for name in names[:MARKERS_LIMIT]:
        if own is not None and name == own.name:
            continue
        held, holder = _held_marker(folder / name)
        if held:
            # Another run holds the device through a lock file that is gone: it still holds.
            return Blocked(handle.device, holder)
    return None


def _held_marker(path: Path) -> tuple[bool, Holder | None]:
    """Whether a marker is locked by a live holder, and its record."""
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    except OSError:
        return False, None
    try:
        try:
            read = read_fd(fd, path)
        except Untrusted:
            return False, None  # not a regular file: no run made it
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True, Holder.from_json(read.data.decode("utf-8", errors="replace"))
        except OSError:
            return False, None
        return False, None
    finally:
        os.close(fd)
