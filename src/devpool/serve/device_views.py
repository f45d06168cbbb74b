"""What the host page shows of the lock folder, as plain JSON-ready data: each device and
who holds it (whole or a share), and the runs waiting for devices with their fair share.
Read through ``LockDir.status`` and the ``Waiter`` records only (views.py: the rest)."""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from devpool.devices.leases import Holder
from devpool.devices.lockdir import LockDir, LockState
from devpool.devices.untrusted import folder_problem
from devpool.devices.waiting_room import Waiter, fair_limit, read_waiters
from devpool.errors import DevpoolError

SCHEMA = 1  # of every view of the host page (views.py's too)


def _holder(holder: Holder | None) -> dict[str, Any]:
    if holder is None:
        return {"run": None, "test": None, "user": None, "pid": None, "since": None, "host": None}
    return {
        "run": holder.session,
        "test": holder.job,
        "user": holder.user,
        "pid": holder.worker_pid or holder.pid,
        "controller_pid": holder.pid,
        "since": holder.since,
        "host": holder.host,
    }


def _device(
    state: LockState, capacity: int | None, leak: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    holders = []
    if state.held:
        holders.append({**_holder(state.holder), "memory": None})
    for share in state.shares:
        holders.append({**_holder(share.holder), "memory": share.amount})
    kind = "held" if state.held else "shared" if state.shares else "free"
    shared = sum(share.amount for share in state.shares)
    return {
        "platform": state.platform,
        "device": state.device,
        "name": f"{state.platform}:{state.device}",
        "state": kind,
        "holders": holders,
        "memory_total": capacity,  # bytes handed out, as a live run's session_start says
        "memory_free": max(0, capacity - shared) if capacity and kind != "held" else None,
        "last_leak": dict(leak) if leak is not None else None,  # what a test left on it
    }


def lock_states(lock_dir: Path) -> list[LockState]:
    """``LockDir.status`` of an existing folder (none when it is missing: serve creates none)."""
    if not lock_dir.is_dir() or lock_dir.is_symlink():
        return []
    try:
        return LockDir(lock_dir).status()
    except (DevpoolError, OSError):
        return []


def devices_view(
    states: Sequence[LockState],
    lock_dir: Path,
    known: Iterable[tuple[str, int]] = (),
    memory: Mapping[tuple[str, int], int] | None = None,
    leaks: Mapping[tuple[str, int], Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Every lock file of the folder as a device with its holder or holders; ``known``
    devices (of live runs' inventories) with no lock file yet show as free; ``memory``:
    the bytes each device hands out (live runs' session_start), for its free memory;
    ``leaks``: each device's last leak (last_leaks)."""
    have = {(s.platform, s.device) for s in states}
    extra = [LockState(p, d, False, None) for p, d in set(known) - have]
    every = sorted([*states, *extra], key=lambda s: (s.platform, s.device))
    sizes = memory or {}
    left = leaks or {}
    devices = [
        _device(s, sizes.get((s.platform, s.device)), left.get((s.platform, s.device)))
        for s in every
    ]
    return {"schema": SCHEMA, "lock_dir": str(lock_dir), "devices": devices}


def waiters(lock_dir: Path) -> list[Waiter]:
    """Runs waiting in the lock folder's ``waiting/``, read as untrusted input as a run reads
    them (dead ones are skipped, not removed; a damaged file is said once, on stderr)."""
    folder = lock_dir / "waiting"
    if folder_problem(folder, any_owner=True) is not None:
        return []
    return read_waiters(folder, _warn_once)


_WARNED: set[str] = set()


def _warn_once(name: str, line: str) -> None:
    if name not in _WARNED and len(_WARNED) < 1000:
        _WARNED.add(name)
        print(f"devpool serve: skipping {line}", file=sys.stderr)


def waiting_view(found: Sequence[Waiter], states: Sequence[LockState]) -> dict[str, Any]:
    """Each waiting run: what it waits for, since when, its fair share of its platform."""
    pools = Counter(state.platform for state in states)
    runs = []
    for waiter in found:
        pool = pools.get(waiter.platform, 0)
        others = [w for w in found if w.platform == waiter.platform and w is not waiter]
        limit = fair_limit(pool, waiter, others) if pool else None
        busy = [
            f"{s.platform}:{s.device}"
            for s in states
            if s.platform == waiter.platform and _held_by_others(s, waiter.session)
        ]
        runs.append(
            {
                "run": waiter.session,
                "pid": waiter.pid,
                "host": waiter.host,
                "platform": waiter.platform,
                "since": waiter.since,
                "wants": waiter.wants,
                "pool": pool,
                "fair_share": limit,
                "busy": busy,
            }
        )
    return {"schema": SCHEMA, "waiting": runs}


def _held_by_others(state: LockState, session: str) -> bool:
    """Whether a run other than `session` holds the device, whole or a share of it: a
    waiting run's own leases are not what it waits for."""
    holders = [share.holder for share in state.shares] if state.shares else []
    if state.held:
        holders.append(state.holder)
    return any(holder is None or holder.session != session for holder in holders)


def alive(pid: int) -> bool:
    """Whether a process of this pid is there (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True
