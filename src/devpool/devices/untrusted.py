"""What another user of the host can put in the shared lock folder, read as untrusted input.

Every user may create files in the lock folder (mode 1777), so anything read there may be
a FIFO, a symlink, a folder, a huge file or a record with fields of the wrong type. Every
reader of the shared folder comes here: a file is opened without blocking and without
following links, read only when it is a regular file, at most ``RECORD_LIMIT`` bytes, and
parsed into checked fields. What fails says why in one sentence (``Untrusted``) and is
skipped by the caller; nothing here hangs or raises anything else.
"""

from __future__ import annotations

import json
import math
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RECORD_LIMIT = 64 * 1024  # a holder or waiter record is a line of JSON
PID_MAX = 1 << 22  # Linux's highest possible pid_max
TEXT_LIMIT = 1024  # a session, host, user, platform or test id in a record
# O_NONBLOCK: opening a FIFO must not wait for a writer; O_NOFOLLOW: a symlink is not ours.
OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)


class Untrusted(Exception):
    """A file of the shared folder that cannot be trusted; the message says why, in a line."""


@dataclass(frozen=True)
class Read:
    """A regular file's bytes (at most the limit) and who owns it, when it was written."""

    data: bytes
    uid: int
    mtime: float


def read_file(path: Path, limit: int = RECORD_LIMIT) -> Read:
    """A small regular file of the shared folder, read without blocking or following a link."""
    try:
        fd = os.open(path, os.O_RDONLY | OPEN_FLAGS)
    except OSError as exc:
        raise Untrusted(f"{path} cannot be opened: {_why(exc)}") from None
    try:
        return read_fd(fd, path, limit)
    finally:
        os.close(fd)


def read_fd(fd: int, path: Path, limit: int = RECORD_LIMIT) -> Read:
    """The bytes of an open file, when it is a regular file of at most `limit` bytes."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Untrusted(f"{path} is not a regular file ({_kind(info.st_mode)})")
        if info.st_size > limit:
            raise Untrusted(f"{path} is too big for a record ({info.st_size} bytes)")
        return Read(os.pread(fd, limit, 0), info.st_uid, info.st_mtime)
    except OSError as exc:
        raise Untrusted(f"{path} cannot be read: {_why(exc)}") from None


def first_line_json(data: bytes, path: Path) -> dict[str, Any]:
    """The JSON object on a record's first line (a longer old tail may follow it)."""
    line = data.decode("utf-8", errors="replace").split("\n", 1)[0]
    try:
        found: Any = json.loads(line)
    except (ValueError, RecursionError):
        raise Untrusted(f"{path} holds no JSON record") from None
    if not isinstance(found, dict):
        raise Untrusted(f"{path} holds no JSON record")
    return found


def integer(record: dict[str, Any], key: str, low: int, high: int, path: Path) -> int:
    """record[key], an int (not a bool) in [low, high]."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise Untrusted(f"{path}: {key} is not a whole number from {low} to {high}")
    return value


def moment(record: dict[str, Any], key: str, path: Path, slack: float = 3600.0) -> float:
    """record[key], a time.time() that has passed (within `slack` of clock skew)."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Untrusted(f"{path}: {key} is not a time")
    if not math.isfinite(value) or not 0 <= value <= time.time() + slack:
        raise Untrusted(f"{path}: {key} is not a time that has passed")
    return float(value)


def text(record: dict[str, Any], key: str, path: Path) -> str:
    """record[key], a string of printable length."""
    value = record.get(key)
    if not isinstance(value, str) or len(value) > TEXT_LIMIT:
        raise Untrusted(f"{path}: {key} is not a short text")
    return value


def folder_problem(path: Path, *, any_owner: bool = False) -> str | None:
    """Why a shared folder cannot be trusted (None: it can): a real folder, not a link, that
    this user may write; owned by root or this user (unless any_owner); where others may
    write it, sticky, so that no user can remove or replace what another put there."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"{path} cannot be used: {_why(exc)}"
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symlink; refusing to use it"
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a folder ({_kind(info.st_mode)})"
    if not any_owner and info.st_uid not in (0, os.geteuid()):
        return (
            f"{path} belongs to {_user(info.st_uid)}, not to root or this user; another user "
            "could remove or replace its lock files there (have root create it, mode 1777)"
        )
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        return f"{path} is writable by every user but not sticky (it should be mode 1777)"
    if not os.access(path, os.W_OK | os.X_OK, follow_symlinks=False):
        return f"{path} is not writable by this user (it should be mode 1777)"
    return None


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    return "a plain file" if stat.S_ISREG(mode) else "an unknown kind"


def _why(exc: OSError) -> str:
    import errno

    if exc.errno == errno.ELOOP:
        return "it is a symlink"
    if exc.errno == errno.ENXIO:
        return "it is a FIFO or socket"
    return exc.strerror or str(exc)


def _user(uid: int) -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(uid).pw_name}"
    except (KeyError, ImportError):
        return f"uid {uid}"
