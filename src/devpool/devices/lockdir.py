"""The lock folder every devpool run on a host shares: one lock file per (platform, device).

``LockDir`` takes whole-device leases here itself and memory shares through shares.py; what
either kind gives back is a ``Lease`` (leases.py). ``status`` is what ``devpool locks`` shows.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devpool.devices.held_markers import (
    drop_marker,
    new_marker,
    removable_by_others,
    successor_problem,
)
from devpool.devices.inventory import format_ids
from devpool.devices.leases import (
    _OPEN_FLAGS,
    LOCK_NAME,
    Blocked,
    Holder,
    Lease,
    Share,
    Unusable,
    _close_all,
    _Handle,
    _open_lock_file,
    _read_record,
    _write_record,
    lock_path,
)
from devpool.devices.resources import HostBlocked, HostLease, host_status, take_host_lease
from devpool.devices.shares import acquire_shares, held_shares
from devpool.devices.untrusted import folder_problem
from devpool.errors import DevpoolError

_FOLDER_MODE = 0o1777


# Host-wide folders, first that every user may write wins; never $TMPDIR, which two runner
# services on one host often set apart (and systemd's PrivateTmp gives each its own /tmp).
HOST_FOLDERS = (Path("/run/lock/devpool"), Path("/dev/shm/devpool"))
FALLBACK_LOCK_DIR = Path("/tmp/devpool-locks")


def default_lock_dir(candidates: Sequence[Path] = HOST_FOLDERS) -> Path:
    """The lock folder shared by every devpool run on this host, whatever its environment:
    the first candidate that every user may write (so every run chooses alike, whoever runs
    it), else /tmp/devpool-locks."""
    for folder in candidates:
        if _open_to_all(folder) or (not _exists(folder) and _open_to_all(folder.parent)):
            return folder
    return FALLBACK_LOCK_DIR


def _exists(path: Path) -> bool:
    try:
        os.lstat(path)
    except OSError:
        return False
    return True


def _open_to_all(folder: Path) -> bool:
    """A real folder every user may create files in (as /tmp: mode 1777), and so may we."""
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    everyone = stat.S_IWOTH | stat.S_IXOTH
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_mode & everyone == everyone
        and os.access(folder, os.W_OK | os.X_OK)
    )


@dataclass(frozen=True)
class Want:
    """Everything one placement needs of the lock folder, taken in one call (LockDir.take)."""

    platform: str
    devices: tuple[int, ...] = ()
    memory: int | None = None  # bytes on each device, shared with other such holds; None: whole
    capacity: Mapping[int, int] = field(default_factory=dict)  # per device, for memory
    ports: int = 0
    port_range: tuple[int, int] = (0, 0)
    resources: Mapping[str, int] = field(default_factory=dict)
    resource_capacity: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Blockers:
    """Who holds what a placement wanted: devices (or their memory), or ports or resources."""

    devices: list[Blocked] = field(default_factory=list)
    host: HostBlocked | None = None


@dataclass(frozen=True)
class LockState:
    """One lock file as ``LockDir.status`` sees it; ``held`` means held whole."""

    platform: str
    device: int
    held: bool
    holder: Holder | None
    shares: tuple[Share, ...] = ()  # partial holders, with their amounts


class LockDir:
    """The lock folder: one lock file per (platform, device)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        _prepare_folder(self.path)

    def lock_path(self, platform: str, device: int) -> Path:
        """The lock file of one device: ``<dir>/<platform>-<device>.lock``."""
        return lock_path(self.path, platform, device)

    def try_acquire(
        self, platform: str, devices: Sequence[int], holder: Holder
    ) -> Lease | list[Blocked]:
        """All-or-nothing, non-blocking: a Lease on every device, or the devices held elsewhere."""
        if len(set(devices)) != len(devices):
            raise ValueError(f"duplicate device ids in {list(devices)}")
        problem = folder_problem(self.path)  # at each use: it may have been swapped
        if problem is not None:
            return [Blocked(device, None, unusable=f"lock folder {problem}") for device in devices]
        paths = {device: self.lock_path(platform, device) for device in devices}
        taken: dict[int, _Handle] = {}
        markers: list[_Handle] = []
        blocked: list[Blocked] = []
        try:
            # A fixed order makes two runs that want overlapping sets collide on the same
            # first device instead of each taking half and both giving up.
            for device in sorted(devices):
                try:
                    handle = _open_lock_file(device, paths[device])
                except Unusable as exc:  # planted by another user: skipped, not waited for
                    blocked.append(Blocked(device, None, unusable=str(exc)))
                    continue
                try:
                    fcntl.flock(handle.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    blocked.append(_blocked_whole(self.path, platform, handle))
                    os.close(handle.fd)
                    continue
                except BaseException:
                    os.close(handle.fd)
                    raise
                taken[device] = handle
                # Write the record at once: a reader must never find a held, empty file.
                _write_record(handle, holder)
                # Whoever made the file, it may stand where a removed one that a live run
                # still holds stood: our marker first, then look (held_markers.py says why).
                own = None
                if removable_by_others(handle):
                    own = new_marker(self.path, platform, device, holder)
                    markers.append(own)
                in_the_way = successor_problem(
                    self.path, platform, handle, own.path if own else None
                ) or _held_in_part(self.path, platform, device)
                if in_the_way is not None:
                    blocked.append(in_the_way)
        except BaseException:
            _close_all([*taken.values(), *markers])
            raise
        if blocked:
            _close_all(taken.values())
            for marker in markers:
                drop_marker(marker)
            return blocked
        return Lease(platform, holder, [taken[device] for device in devices], markers=markers)

    def take(self, want: Want, holder: Holder) -> Lease | Blockers:
        """All or nothing, non-blocking, and holding nothing while anything is missing: the
        devices (whole, or a memory share of each), then the ports and named resources, as
        one Lease; or who holds what is in the way."""
        if want.devices and want.memory is not None:
            got = self.try_acquire_memory(
                want.platform, want.devices, want.memory, want.capacity, holder
            )
        elif want.devices:
            got = self.try_acquire(want.platform, want.devices, holder)
        else:
            got = Lease(want.platform, holder, [])
        if not isinstance(got, Lease):
            return Blockers(devices=got)
        if not (want.ports or want.resources):
            return got
        try:
            host = take_host_lease(
                self.path,
                holder,
                want.ports,
                want.port_range,
                dict(want.resources),
                dict(want.resource_capacity),
            )
        except BaseException:
            got.release()
            raise
        if not isinstance(host, HostLease):
            got.release()  # no hold-and-wait: two runs can never deadlock on the rest
            return Blockers(host=host)
        got.attach(host)
        return got

    def try_acquire_memory(
        self,
        platform: str,
        devices: Sequence[int],
        amount: int,
        capacity: Mapping[int, int],
        holder: Holder,
    ) -> Lease | list[Blocked]:
        """All-or-nothing, non-blocking: ``amount`` bytes on each device, shared with other
        partial holders while the sum stays within ``capacity[device]``; or what is in the way.
        """
        return acquire_shares(self.path, platform, devices, amount, capacity, holder)

    def status(self) -> list[LockState]:
        """Every lock file in the folder: platform, device, held or free, and its last holder."""
        states = []
        with os.scandir(self.path) as entries:
            for entry in entries:
                match = LOCK_NAME.match(entry.name)
                if match is None or not entry.is_file(follow_symlinks=False):
                    continue
                try:
                    fd = os.open(entry.path, os.O_RDONLY | _OPEN_FLAGS)
                except OSError:
                    continue
                try:
                    held = not _try_shared_lock(fd)
                    holder = _read_record(fd)
                finally:
                    os.close(fd)  # also drops the shared lock, if we got it
                platform, device = match["platform"], int(match["device"])
                shares = () if held else tuple(held_shares(self.path, platform, device))
                states.append(LockState(platform, device, held, holder, shares))
        return sorted(states, key=lambda state: (state.platform, state.device))

    def held_by_others(self, session: str) -> list[tuple[str, Holder | None]]:
        """What runs other than `session` hold in the folder now, read from the files
        themselves: (``sim:3``, ``sim:2 (8 GiB)``, ``port 29500``, ``resource hccl``, holder)."""
        held: list[tuple[str, Holder | None]] = []
        for state in self.status():
            name = f"{state.platform}:{state.device}"
            if state.held:
                held.append((name, state.holder))
            for share in state.shares:
                held.append((name, share.holder))
        for host in host_status(self.path):
            what = f"port {host.name}" if host.kind == "port" else f"resource {host.name}"
            held.append((what, host.holder))
        return [(what, h) for what, h in held if h is None or h.session != session]

    def __repr__(self) -> str:
        return f"LockDir({str(self.path)!r})"


def describe_holders(held: Sequence[tuple[str, Holder | None]]) -> str:
    """One part per holding run, each run and each of its tests named once:
    ``sim:0-3, port 29500 held by pid 12 (user ..., session ..., tests a, b, since ...)``."""
    by_run: dict[tuple[str, int] | None, list[tuple[str, Holder | None]]] = {}
    for what, holder in held:
        key = None if holder is None else (holder.session, holder.pid)
        by_run.setdefault(key, []).append((what, holder))
    parts = []
    for entries in by_run.values():
        things = list(dict.fromkeys(what for what, _ in entries))
        holders = [h for _, h in entries if h is not None]
        if not holders:
            parts.append(f"{', '.join(things)} held by an unknown holder")
            continue
        tests = list(dict.fromkeys(h.job for h in holders if h.job))
        parts.append(f"{', '.join(_compact(things))} held by {holders[0].describe(tests)}")
    return "; ".join(parts)


def _compact(things: list[str]) -> list[str]:
    """``sim:0, sim:1, port 9`` → ``sim:0,1, port 9``: devices of one platform together."""
    devices: dict[str, list[str]] = {}
    rest = []
    for thing in things:
        platform, colon, device = thing.partition(":")
        if colon and device.isdigit():
            devices.setdefault(platform, []).append(device)
        else:
            rest.append(thing)
    return [f"{p}:{format_ids(int(d) for d in ds)}" for p, ds in devices.items()] + rest


def _blocked_whole(folder: Path, platform: str, handle: _Handle) -> Blocked:
    """Why an exclusive lock failed: a whole holder, or partial holders (a shared lock works)."""
    if _try_shared_lock(handle.fd):
        shares = tuple(held_shares(folder, platform, handle.device))
        with contextlib.suppress(OSError):
            fcntl.flock(handle.fd, fcntl.LOCK_UN)
        if shares:
            return Blocked(handle.device, shares[0].holder, shares)
    return Blocked(handle.device, _read_record(handle.fd))


def _held_in_part(folder: Path, platform: str, device: int) -> Blocked | None:
    """Partial holders that hold a device whose lock file we hold whole: they hold a lock
    file that was removed (their share records serve as their markers)."""
    shares = tuple(held_shares(folder, platform, device))
    return Blocked(device, shares[0].holder, shares) if shares else None


def _try_shared_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _prepare_folder(path: Path) -> None:
    """The lock folder, made if missing (mode 1777), and checked: a real folder owned by
    root or this user, sticky where every user may write it (untrusted.folder_problem)."""
    if not _exists(path):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(path, _FOLDER_MODE)
            # mkdir's mode is filtered by the umask; other users' runs must be able to
            # create lock files here, and the sticky bit keeps them from deleting ours.
            os.chmod(path, _FOLDER_MODE, follow_symlinks=False)
        except FileExistsError:
            pass  # another run created it first
        except OSError as exc:
            raise DevpoolError(f"lock folder {path} is not writable: {exc.strerror}") from None
    problem = folder_problem(path)
    if problem is not None:
        raise DevpoolError(f"lock folder {problem}")
