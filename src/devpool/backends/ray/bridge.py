"""The bridge from a Ray worker's rank actors to the controller's pipe.

A thread per worker pulls each rank's event lines from its actor, merges the ranks into one
stream (one start, report and finish per test; FailFast ends the others when one rank dies,
as ranks(n) on a host) and writes it into a local pipe, which the loop reads as it reads a
local worker's.
"""

from __future__ import annotations

import contextlib
import signal
import time

from devpool.backends.failfast import FailFast
from devpool.backends.ray.cluster import import_ray
from devpool.backends.ray.ending import gather_logs, why_lost
from devpool.backends.ray.handle import RayWorker
from devpool.config import Settings
from devpool.worker import protocol, wire

EVENTS_WAIT = 0.5  # seconds an actor holds an events() call open waiting for output
LOST_EXIT = -int(signal.SIGKILL)  # the exit status reported for a worker whose node went away


class EventBridge:
    """Carries one worker's ranks' events into the controller's pipe (RayBackend's part)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def pump(self, worker: RayWorker, write_end: int) -> int:
        """Bridge the ranks' events into the controller's pipe until every rank has exited."""
        ray = import_ray()
        fate = FailFast(worker.world, self.settings.rank_straggle)  # as ranks(n) on a host
        readers = [wire.Reader() for _ in worker.ranks]
        calls = {rank.actor.events.remote(EVENTS_WAIT): rank for rank in worker.ranks}
        while calls:
            due = fate.due()
            wait = EVENTS_WAIT * 4
            if due:
                wait = max(0.01, min(wait, min(due) - time.monotonic()))
            ready, _ = ray.wait(list(calls), num_returns=1, timeout=wait)
            fate.stopping, fate.signalled = worker.stopping, worker.stop_asked.is_set()
            now = time.monotonic()
            out: list[protocol.Message] = []
            for ref in ready:
                rank = calls.pop(ref)
                try:
                    data, code = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    worker.lost = f"node {rank.address or '?'} lost ({why_lost(exc)})"
                    self._kill_ranks(worker)
                    return LOST_EXIT
                for message in readers[rank.rank].feed(data):
                    out += fate.take(rank.rank, message, now)
                if code is None:
                    calls[rank.actor.events.remote(EVENTS_WAIT)] = rank
                    continue
                rank.code = code
                out += fate.rank_gone(rank.rank, code, rank.pid, now)
            fate.tick(now)
            for index, signum in fate.take_orders():
                with contextlib.suppress(Exception):
                    worker.ranks[index].actor.signal.remote(int(signum), True)
            worker.fate = fate
            if any(isinstance(m, protocol.Finish) for m in out):
                gather_logs(worker, fetch=self.settings.ray_ship_code)
            for message in out:
                wire.write(write_end, message)
        codes = [rank.code or 0 for rank in worker.ranks]
        culprit = fate.culprit
        if culprit is not None and codes[culprit]:
            return codes[culprit]
        return next((c for c in codes if c), 0)

    def _kill_ranks(self, worker: RayWorker) -> None:
        for rank in worker.ranks:
            with contextlib.suppress(Exception):
                rank.actor.signal.remote(int(signal.SIGKILL), True)
