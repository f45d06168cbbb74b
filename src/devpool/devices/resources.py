"""Named host resources and the host lease: ports and resource units, held beside devices.

``[tool.devpool.resources] hccl = 1`` declares a resource with capacity 1. Its units are
the files ``<lock dir>/resource-<name>-<i>.lease`` for i < capacity; a holder of k units
holds k of them locked exclusively: a counting semaphore that every run on the host
shares and the kernel frees when its holder dies. Ports are ports.py's.

A ``HostLease`` is what one job holds beside its devices: its ports and resource units.
It is taken all or nothing and without waiting (``take_host_lease``), so a run never
holds part of what a job needs while it waits for the rest; the caller then attaches it
to the job's device lease, whose descriptors the worker inherits.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from devpool.devices.leases import (
    _OPEN_FLAGS,
    Holder,
    Unusable,
    _close,
    _close_all,
    _Handle,
    _open_lock_file,
    _read_record,
    _write_record,
)
from devpool.devices.ports import PORT_NAME, acquire_ports

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
UNIT_NAME = re.compile(
    r"^resource-(?P<name>[A-Za-z_][A-Za-z0-9_]*)-(?P<unit>0|[1-9][0-9]*)\.lease$"
)


def parse_resources(table: object, where: str) -> dict[str, int]:
    """[tool.devpool.resources] → {name: capacity}; ValueError names the bad entry."""
    if not isinstance(table, Mapping):
        raise ValueError(f"{where}: [tool.devpool.resources] must be a table of name = capacity")
    out: dict[str, int] = {}
    for name, capacity in table.items():
        if not isinstance(name, str) or NAME.match(name) is None:
            raise ValueError(
                f"{where}: [tool.devpool.resources] name {name!r} must be a Python identifier"
            )
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(
                f"{where}: [tool.devpool.resources] {name} must be a whole number ≥ 1, "
                f"got {capacity!r}"
            )
        out[name] = capacity
    return out


def unit_path(folder: Path, name: str, unit: int) -> Path:
    return folder / f"resource-{name}-{unit}.lease"


@dataclass(frozen=True)
class HostBlocked:
    """Why a host lease could not be taken: the resource (or 'ports') and who holds it."""

    what: str  # a resource name, or "ports"
    free: int  # units (or ports) that could be locked when it was tried
    holders: tuple[Holder | None, ...] = ()

    def describe(self) -> str:
        if self.what == "ports":
            return "no free bindable port left in the [tool.devpool] ports range"
        who = "; ".join(h.describe() if h else "an unknown holder" for h in self.holders)
        return f"resource {self.what} held by {who or 'other runs'}"


class HostLease:
    """Ports and resource units one job holds; released with the device lease it is attached to."""

    def __init__(self, ports: Sequence[_Handle], units: Mapping[str, Sequence[_Handle]]) -> None:
        self.ports: tuple[int, ...] = tuple(handle.device for handle in ports)
        self.resources: dict[str, int] = {name: len(hs) for name, hs in units.items()}
        self._handles = list(ports) + [h for hs in units.values() for h in hs]
        self.released = False
        self.keep_master_port = False  # the caller's MASTER_PORT stays (run/host_leases.py)

    def __bool__(self) -> bool:
        return bool(self._handles)

    def fds(self) -> list[int]:
        return [handle.fd for handle in self._handles]

    def set_job(self, holder: Holder) -> None:
        for handle in self._handles:
            _write_record(handle, holder)

    def release(self, *, unlock: bool = True) -> None:
        if self.released:
            return
        self.released = True
        handles, self._handles = self._handles, []
        for handle in handles:
            _close(handle.fd, unlock=unlock)

    def __repr__(self) -> str:
        return f"HostLease(ports={list(self.ports)}, resources={self.resources})"


def _take_units(
    folder: Path, name: str, count: int, capacity: int
) -> tuple[list[_Handle], HostBlocked | None]:
    """count of the capacity units of one resource, or none and what was in the way."""
    taken: list[_Handle] = []
    holders: list[Holder | None] = []
    try:
        for unit in range(capacity):
            try:
                handle = _open_lock_file(unit, unit_path(folder, name, unit))
            except Unusable:
                holders.append(None)  # planted by another user: that unit is not free
                continue
            try:
                fcntl.flock(handle.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holders.append(_read_record(handle.fd))
                os.close(handle.fd)
                continue
            except BaseException:
                os.close(handle.fd)
                raise
            if len(taken) < count:
                taken.append(handle)
            else:
                _close_all([handle])  # only counted, to say how many were free
    except BaseException:
        _close_all(taken)
        raise
    free = capacity - len(holders)
    if len(taken) < count:
        _close_all(taken)
        return [], HostBlocked(name, free, tuple(holders))
    return taken, None


def take_host_lease(
    folder: Path,
    holder: Holder,
    ports: int,
    port_range: tuple[int, int],
    resources: Mapping[str, int],
    capacity: Mapping[str, int],
) -> HostLease | HostBlocked:
    """All or nothing, non-blocking: the ports and resource units, or what is in the way."""
    units: dict[str, list[_Handle]] = {}
    got_ports: list[_Handle] = []
    try:
        # Names in a fixed order, as devices: two runs collide on the first, not halfway.
        for name in sorted(resources):
            taken, blocked = _take_units(folder, name, resources[name], capacity[name])
            if blocked is not None:
                _close_all(h for hs in units.values() for h in hs)
                return blocked
            units[name] = taken
        found = acquire_ports(folder, ports, port_range)
        if found is None:
            _close_all(h for hs in units.values() for h in hs)
            return HostBlocked("ports", 0)
        got_ports = found
    except BaseException:
        _close_all(h for hs in units.values() for h in hs)
        _close_all(got_ports)
        raise
    lease = HostLease(got_ports, units)
    lease.set_job(holder)  # a reader must never find a held, empty file
    return lease


@dataclass(frozen=True)
class HostLockState:
    """One held port or resource unit as ``devpool locks`` shows it."""

    kind: str  # "port" or "resource"
    name: str  # the port number, or the resource name
    unit: int  # the resource unit (0 for a port)
    holder: Holder | None


def host_status(folder: Path) -> list[HostLockState]:
    """Every held port and resource unit in the lock folder, with its holder."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    states = []
    for name in names:
        port, unit = PORT_NAME.match(name), UNIT_NAME.match(name)
        if port is None and unit is None:
            continue
        try:
            fd = os.open(folder / name, os.O_RDONLY | _OPEN_FLAGS)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_record(fd)
            else:
                continue  # free
            if port is not None:
                states.append(HostLockState("port", port["port"], 0, holder))
            elif unit is not None:
                states.append(HostLockState("resource", unit["name"], int(unit["unit"]), holder))
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
    return sorted(states, key=lambda s: (s.kind, s.name.zfill(8), s.unit))
