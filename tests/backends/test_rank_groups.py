"""RankGroups (backends/rank_groups.py): the local backend's book of ranks(n) groups: their
deadlines, and reaping a group (a group that will not end is killed, then forgotten with
its ranks' pipes). Groups and pipes are fakes: no process is started."""

from __future__ import annotations

import signal
import subprocess
from types import SimpleNamespace
from typing import Any

from devpool.backends import WorkerHandle
from devpool.backends.rank_groups import RankGroups


class Pipes:
    def __init__(self) -> None:
        self.uncalled: list[int] = []
        self.forgotten: list[Any] = []

    def uncall(self, fd: int) -> None:
        self.uncalled.append(fd)

    def forget(self, worker: Any) -> None:
        self.forgotten.append(worker)


class Group(WorkerHandle):
    """A rank group as RankGroups sees it (wait, signal_group, close), with what it was told."""

    def __init__(self, key: int, fds: list[int], due: list[float], ends: bool = True) -> None:
        self.key, self.ends, self._due = key, ends, due
        self.ranks = [
            SimpleNamespace(worker=SimpleNamespace(fd_out=fd, exited=False), gone=False)
            for fd in fds
        ]
        self.signals: list[int] = []
        self.checked: list[float] = []
        self.exited = self.closed = False

    def due(self) -> list[float]:
        return self._due

    def check(self, now: float, read: Any) -> None:
        self.checked.append(now)
        self.ranks[0].gone = True  # a straggler the fail-fast deadline ended

    def wait(self, timeout: float | None = None) -> int:
        if not self.ends and not self.signals:
            raise subprocess.TimeoutExpired("group", timeout or 0)
        return -self.signals[-1] if self.signals else 0

    def signal_group(self, signum: int) -> None:
        self.signals.append(signum)

    def close(self) -> None:
        self.closed = True


def _groups(*groups: Group) -> tuple[RankGroups, Pipes]:
    pipes = Pipes()
    book = RankGroups(pipes)  # type: ignore[arg-type]
    for group in groups:
        book.groups[group.key] = group  # type: ignore[assignment]
    return book, pipes


def test_deadlines_of_every_group_and_gone_ranks_stop_being_read() -> None:
    first, second = Group(1, [10, 11], [5.0]), Group(2, [20], [3.0, 9.0])
    book, pipes = _groups(first, second)
    assert sorted(book.due()) == [3.0, 5.0, 9.0]
    book.check(4.0)
    assert first.checked == [4.0] and second.checked == [4.0]
    assert sorted(pipes.uncalled) == [10, 20]  # each group's first rank ended


def test_a_group_that_ends_is_reaped_and_forgotten() -> None:
    group = Group(1, [10, 11], [])
    book, pipes = _groups(group)
    assert book.reap(group, wait=1.0) == 0  # type: ignore[arg-type]
    assert group.signals == [] and group.exited and group.closed
    assert all(rank.worker.exited for rank in group.ranks)
    assert sorted(pipes.uncalled) == [10, 11] and pipes.forgotten == [group]
    assert book.groups == {}


def test_a_group_that_does_not_end_in_time_is_killed() -> None:
    group = Group(1, [10], [], ends=False)
    book, _ = _groups(group)
    assert book.reap(group, wait=0.0) == -signal.SIGKILL  # type: ignore[arg-type]
    assert group.signals == [signal.SIGKILL] and book.groups == {}
