"""Partial device holds by memory, across processes and runs on one host, freed by the kernel.

For each device, beside its lock file ``<platform>-<d>.lock``:
- a partial holder holds a *shared* flock on the lock file, so an exclusive holder (who
  takes it exclusively) and partial holders exclude each other;
- each partial holder keeps one record file ``<platform>-<d>.share-<pid>-<token>`` locked
  exclusively for as long as it holds; the record says who holds and how many bytes. What
  is held on a device is the sum over the records whose lock is held: a SIGKILLed holder's
  locks go with its last descriptor, and its record stops counting by itself;
- ``<platform>-<d>.mutex`` is locked briefly around "sum the records, then add one", so
  two processes can never both see room for one more and both take it. Stale records are
  removed only under the mutex too: a record being created is never mistaken for stale.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from devpool.devices.held_markers import successor_problem
from devpool.devices.leases import (
    _OPEN_FLAGS,
    Blocked,
    Holder,
    Lease,
    Share,
    Unusable,
    _close,
    _close_all,
    _Handle,
    _open_lock_file,
    _read_record,
    _write_record,
    lock_path,
)
from devpool.devices.untrusted import Untrusted, read_fd

MUTEX_WAIT = 5.0  # seconds: the mutex is held for a directory scan, never longer
_RECORD_MODE = 0o644  # others only test its lock and read it
_READ_LIMIT = 64 * 1024


def _record_prefix(platform: str, device: int) -> str:
    return f"{platform}-{device}.share-"


def _amount_of(raw: bytes) -> tuple[Holder | None, int | None]:
    import json

    line = raw.decode("utf-8", errors="replace").split("\n", 1)[0]
    try:
        data: Any = json.loads(line)
    except ValueError:
        return None, None
    amount = data.get("amount") if isinstance(data, dict) else None
    if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
        return None, None
    return Holder.from_json(line), amount


def read_shares(
    folder: Path, platform: str, device: int, *, clean: bool, unknown: int = 0
) -> Iterator[tuple[Share, Path]]:
    """The held share records of one device (oldest first), and their paths.

    clean=True (only under the device's mutex): remove records whose lock is free. A held
    record that cannot be read counts as ``unknown`` bytes (the caller passes the whole
    capacity: what cannot be counted is assumed to fill the device).
    """
    prefix = _record_prefix(platform, device)
    try:
        names = sorted(name for name in os.listdir(folder) if name.startswith(prefix))
    except OSError:
        return
    found: list[tuple[float, Share, Path]] = []
    for name in names:
        path = folder / name
        try:
            fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
        except OSError:
            continue  # removed since we listed it
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    data = read_fd(fd, path, _READ_LIMIT).data
                except Untrusted:
                    continue  # not a regular file, or too big: no run made it
                holder, amount = _amount_of(data)
                share = Share(holder, unknown if amount is None else amount)
                found.append((holder.since if holder else 0.0, share, path))
                continue
            if clean:
                with contextlib.suppress(OSError):  # another user's: theirs to remove
                    os.unlink(path)
        finally:
            os.close(fd)
    for _, share, path in sorted(found, key=lambda entry: entry[0]):
        yield share, path


def held_shares(folder: Path, platform: str, device: int) -> list[Share]:
    """The partial holders of one device now (records whose lock is held), oldest first."""
    return [share for share, _ in read_shares(folder, platform, device, clean=False)]


@contextlib.contextmanager
def _mutex(folder: Path, platform: str, device: int) -> Iterator[bool]:
    """The device's mutex, held for the block; yields False if it could not be had in time."""
    handle = _open_lock_file(device, folder / f"{platform}-{device}.mutex")
    try:
        deadline = time.monotonic() + MUTEX_WAIT
        pause = 0.001
        while True:
            try:
                fcntl.flock(handle.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                # Held for a scan of one folder by a live process (a dead one's is freed).
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
        yield True
    finally:
        _close(handle.fd, unlock=True)


def _new_record(folder: Path, platform: str, device: int) -> _Handle:
    name = f"{_record_prefix(platform, device)}{os.getpid()}-{secrets.token_hex(6)}"
    path = folder / name
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, _RECORD_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh name: nobody else has it
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return _Handle(device, path, fd)


def _drop_record(handle: _Handle) -> None:
    with contextlib.suppress(OSError):
        os.unlink(handle.path)
    _close(handle.fd, unlock=True)


def _take_one(
    folder: Path,
    platform: str,
    device: int,
    amount: int,
    capacity: int,
    holder: Holder,
) -> tuple[_Handle, _Handle] | Blocked:
    """A shared lock on the device file and a share record, or what is in the way."""
    handle = _open_lock_file(device, lock_path(folder, platform, device))
    try:
        try:
            fcntl.flock(handle.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            blocked = Blocked(device, _read_record(handle.fd))  # held whole
            os.close(handle.fd)
            return blocked
        with _mutex(folder, platform, device) as ours:
            if not ours:
                _close(handle.fd, unlock=True)
                return Blocked(device, None)
            shares = [
                s for s, _ in read_shares(folder, platform, device, clean=True, unknown=capacity)
            ]
            used = sum(share.amount for share in shares)
            if used + amount > capacity:
                _close(handle.fd, unlock=True)
                first = shares[0].holder if shares else None
                return Blocked(device, first, tuple(shares), max(0, capacity - used))
            record = _new_record(folder, platform, device)
            try:
                # Written before the mutex is let go: the next summer must count it.
                _write_record(record, holder, amount)
            except BaseException:
                _drop_record(record)
                raise
        # The record is our marker: now look for a whole holder of a removed lock file.
        in_the_way = successor_problem(folder, platform, handle)
        if in_the_way is not None:
            _drop_record(record)
            _close(handle.fd, unlock=True)
            return in_the_way
    except BaseException:
        with contextlib.suppress(OSError):
            _close(handle.fd, unlock=True)
        raise
    return handle, record


def acquire_shares(
    folder: Path,
    platform: str,
    devices: Sequence[int],
    amount: int,
    capacity: Mapping[int, int],
    holder: Holder,
) -> Lease | list[Blocked]:
    """LockDir.try_acquire_memory in the lock folder ``folder``: amount bytes on every device,
    or what is in the way."""
    if len(set(devices)) != len(devices):
        raise ValueError(f"duplicate device ids in {list(devices)}")
    if amount <= 0:
        raise ValueError(f"a memory lease needs a positive amount, got {amount}")
    missing = [d for d in devices if d not in capacity]
    if missing:
        raise ValueError(f"no memory capacity known for {platform}:{missing[0]}")
    taken: dict[int, tuple[_Handle, _Handle]] = {}
    blocked: list[Blocked] = []
    try:
        # One device at a time, in a fixed order, each under its own mutex: no deadlock.
        for device in sorted(devices):
            try:
                got = _take_one(folder, platform, device, amount, capacity[device], holder)
            except Unusable as exc:  # planted by another user: skipped, not waited for
                got = Blocked(device, None, unusable=str(exc))
            if isinstance(got, Blocked):
                blocked.append(got)
            else:
                taken[device] = got
    except BaseException:
        _give_back(taken.values())
        raise
    if blocked:
        _give_back(taken.values())
        return blocked
    handles = [taken[device][0] for device in devices]
    records = [taken[device][1] for device in devices]
    return Lease(platform, holder, handles, records, amount)


def _give_back(taken: Iterable[tuple[_Handle, _Handle]]) -> None:
    pairs = list(taken)
    for _, record in pairs:
        _drop_record(record)
    _close_all(handle for handle, _ in pairs)
