"""Which kinds of worker a run will need, guessed from the duration history before it has
collected: their templates start collecting beside this process, so a lease never waits
for one (the edit-run loop's single test, the first phase of a big suite).

A guess only: once the plan is made, a template whose modules do not cover its kind's
modules is replaced (run/pool.py), and a kind no test needs is closed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from devpool.errors import DevpoolError
from devpool.history.location import HistorySpec, history_found, open_history

RECENT = 5000  # history rows read, the newest: enough to see the kinds of the latest runs


@dataclass(frozen=True)
class EarlyKind:
    """A request size the last runs of these tests needed, and the modules of its tests."""

    size: int
    modules: frozenset[str]  # absolute paths, as a worker's collect list names them
    first: float  # the most device-seconds one of its tests took: the scheduler's order


def early_kinds(
    history: HistorySpec,
    platform: str,
    devices: int,
    rootpath: Path,
    args: Sequence[str],
    cwd: Path,
) -> list[EarlyKind]:
    """Kinds (CPU-only: size 0) the history's latest results of the selected paths needed,
    in the order the scheduler will start them (biggest single test first); [] when the
    history knows none of them."""
    if not history_found(history):
        return []
    try:
        with open_history(history, read_only=True) as opened:
            rows = opened.recent(platform, RECENT)
    except DevpoolError:
        return []  # an old or foreign file: the run says so itself when it reads it
    prefixes = _selected(args, cwd, rootpath)
    files: dict[int, set[str]] = {}
    first: dict[int, float] = {}
    for nodeid, size, duration in rows:
        size = int(size)
        if not 0 <= size <= devices or not _under(str(nodeid), prefixes):
            continue
        files.setdefault(size, set()).add(str(nodeid).split("::", 1)[0])
        first[size] = max(first.get(size, 0.0), max(size, 0.5) * float(duration))
    root = str(rootpath)
    kinds = [
        EarlyKind(
            size, frozenset(os.path.normpath(os.path.join(root, f)) for f in names), first[size]
        )
        for size, names in files.items()
    ]
    return sorted(kinds, key=lambda kind: -kind.first)


def _selected(args: Sequence[str], cwd: Path, rootpath: Path) -> list[str] | None:
    """The invocation's paths and node ids, relative to the rootdir (None: everything)."""
    out = []
    for arg in args:
        if arg.startswith("-"):
            continue
        path, colons, rest = arg.partition("::")
        try:
            relative = os.path.relpath(os.path.normpath(cwd / path), rootpath)
        except ValueError:
            return None
        if relative == "." and not colons:
            return None
        out.append(relative + colons + rest)
    return out or None


def _under(nodeid: str, prefixes: list[str] | None) -> bool:
    """Whether a test is one the invocation names: its file, folder, node id or parent."""
    if prefixes is None:
        return True
    for prefix in prefixes:
        if nodeid == prefix or nodeid.startswith((prefix + "::", prefix + "[")):
            return True
        if "::" not in prefix and nodeid.startswith(prefix.rstrip("/") + "/"):
            return True
    return False
