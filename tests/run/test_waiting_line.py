"""The waiting line (run/health.Foreign): what the run needs, and each holding run named once
(issue 39, 2.2). Leases are real flocks in a lock folder, held by "other runs" of this process."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from devpool.devices.leases import Holder, Lease
from devpool.devices.lockdir import LockDir
from devpool.run.health import Foreign


def foreign(lock: LockDir, said: list[str]) -> Foreign:
    platform = SimpleNamespace(name="sim")
    ctx: Any = SimpleNamespace(
        inventory=SimpleNamespace(platform=platform, devices=(0, 1, 2, 3)),
        run_id="ours",
        lock_dir=lock,
        probe=None,
    )
    return Foreign(ctx, said.append)


def other_run(lock: LockDir, session: str, device: int) -> Lease:
    got = lock.try_acquire("sim", [device], Holder.for_this_process(session, f"t.py::{session}"))
    assert isinstance(got, Lease), got
    return got


def test_each_holding_run_is_named_once_and_the_line_says_what_the_run_needs(
    tmp_path: Path,
) -> None:
    lock = LockDir(tmp_path)
    said: list[str] = []
    waits = foreign(lock, said)
    first = other_run(lock, "first", 0)
    second = None
    try:
        blocked = lock.try_acquire("sim", [0, 1], Holder.for_this_process("ours", "t.py::a"))
        assert isinstance(blocked, list)
        waits.mark(blocked, now=0.0, needs=2)
        assert len(said) == 1
        assert said[0].startswith(
            "waiting for devices held by other runs (this run needs 2 sim devices of 4): "
            "sim:0 held by pid"
        ), said
        assert "session first" in said[0]
        waits.mark(blocked, now=1.0)  # the same run again: nothing new to say
        assert len(said) == 1, said
        second = other_run(lock, "second", 2)
        blocked = lock.try_acquire("sim", [2, 3], Holder.for_this_process("ours", "t.py::b"))
        assert isinstance(blocked, list)
        waits.mark(blocked, now=2.0)  # sim:0 is still waited for: only the new run is named
        assert len(said) == 2, said
        assert "session second" in said[1] and "session first" not in said[1], said
        assert "(this run needs 2 sim devices of 4)" in said[1]
        waits.waiting(lock.held_by_others("ours"), needs=1)  # a stalled queue: both named
        assert len(said) == 2, said
    finally:
        first.release()
        if second is not None:
            second.release()
