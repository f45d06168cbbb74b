"""The ranks(n) groups of the local backend: each one test's rank workers, seen as one worker.

Once its ranks have started, a group takes their event pipes out of the backend's poll: each
rank's events are pumped into the group's merge (backends/ranks.py), whose one stream the
loop reads from the group's own pipe. Here: making a group, its deadlines, draining and
reaping it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from devpool.backends import WorkerHandle
from devpool.backends.pipes import EventPipes, read_available

if TYPE_CHECKING:  # a run without ranks(n) tests never loads the ranks' merge
    from devpool.backends.ranks import Rank, RankGroup


class RankGroups:
    """The local backend's ranks(n) groups, by key, and their ranks' pipes (LocalBackend's part)."""

    def __init__(self, pipes: EventPipes) -> None:
        self.pipes = pipes  # the backend's: a group is watched, its ranks are pumped
        self.groups: dict[int, RankGroup] = {}  # ranks(n) tests' workers, by key

    def group(
        self, key: int, workers: list[WorkerHandle], shape: int, straggle: float
    ) -> RankGroup:
        """One ranks(n) test's workers, one per rank (rank order), as one worker of this key."""
        # Imported here: a run without ranks(n) tests never loads the ranks' merge.
        from devpool.backends.ranks import Rank, RankGroup, group_pipe

        read_end, write_end = group_pipe()
        first = workers[0]
        ranks = [Rank(index, worker) for index, worker in enumerate(workers)]
        group = RankGroup(
            key,
            first.devices,
            first.lease,
            ranks,
            first.log,
            read_end,
            write_end,
            shape,
            straggle=straggle,
        )
        for rank in ranks:
            self.pipes.forget(rank.worker)
            self.pipes.call(rank.worker.fd_out, self._pump_rank(group, rank))
        self.pipes.watch(group)
        self.groups[group.key] = group
        return group

    def _pump_rank(self, group: RankGroup, rank: Rank) -> Callable[[], None]:
        def readable() -> None:
            group.pump(rank, read_available)
            if rank.gone:
                self.pipes.uncall(rank.worker.fd_out)

        return readable

    def check(self, now: float) -> None:
        """Each group's fail-fast deadlines (a straggling rank is ended)."""
        for group in self.groups.values():
            group.check(now, read_available)
            for rank in group.ranks:
                if rank.gone:
                    self.pipes.uncall(rank.worker.fd_out)

    def due(self) -> list[float]:
        """When check() next has something to do."""
        return [at for group in self.groups.values() for at in group.due()]

    def drain(self, group: RankGroup) -> None:
        """Pump what the ranks of an exited group still had into its merge."""
        for rank in group.ranks:
            group.pump(rank, read_available)
            self.pipes.uncall(rank.worker.fd_out)
        group.check(time.monotonic(), read_available)

    def reap(self, group: RankGroup, wait: float) -> int | None:
        """The group's exit status once its ranks ended; it is forgotten."""
        code = group.wait_or_kill(wait)
        group.exited = True
        for rank in group.ranks:
            rank.worker.exited = True
            self.pipes.uncall(rank.worker.fd_out)
        self.pipes.forget(group)
        group.close()
        self.groups.pop(group.key, None)
        return code
