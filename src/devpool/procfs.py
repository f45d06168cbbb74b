"""A process's /proc/PID/stat, read in one place (Linux; elsewhere every answer is "gone").

Imports nothing: select/below.py reads it at every `import devpool`.
"""

from __future__ import annotations

STARTTIME = 19  # starttime's index among the fields after the command name (field 22)
_GONE = ("Z", "X", "x")  # a zombie or a dead process: ended, not yet reaped


def read(pid: int | str, task: int | None = None) -> tuple[str, list[str]] | None:
    """The command name and the fields after it (state, ppid, pgrp, ..., starttime at
    STARTTIME) of a process, or of one of its threads; None once it is gone. The name may
    hold spaces and parentheses: the fields follow the last ')'."""
    path = f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat"
    try:
        with open(path, "rb") as handle:
            raw = handle.read().decode(errors="replace")
    except OSError:
        return None
    left, right = raw.find("("), raw.rfind(")")
    if left < 0 or right < 0:
        return None
    return raw[left + 1 : right], raw[right + 2 :].split()


def fields(pid: int | str, task: int | None = None) -> list[str]:
    """The fields after the command name; [] once the process is gone."""
    found = read(pid, task)
    return found[1] if found is not None else []


def alive(pid: int | str, task: int | None = None) -> bool:
    """Whether the process (or thread) still runs: not gone, not a zombie."""
    found = fields(pid, task)
    return bool(found) and found[0] not in _GONE


def started(pid: int | str) -> int | None:
    """The process's start, in clock ticks since boot; None once it is gone."""
    found = fields(pid)
    try:
        return int(found[STARTTIME])
    except (IndexError, ValueError):
        return None
