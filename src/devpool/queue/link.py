"""A job's link to the queue's database, which the database going away does not end: a call
while it is away answers None, and the next one connects again."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TypeVar

from devpool.database import driver, where
from devpool.errors import DevpoolError
from devpool.queue.store import QueueStore

T = TypeVar("T")


class QueueLink:
    """This job's store, connected again after the database was away; `gone` when the last
    call found it away for longer than a lease, `failure` the sentence that says so."""

    def __init__(self, url: str, run_id: str, lease: float, store: QueueStore) -> None:
        self.url, self.run_id, self.lease = url, run_id, lease
        self.store: QueueStore | None = store
        self.down_since: float | None = None  # the database has not answered since
        self.gone = False
        self.failure = ""  # why this job stopped taking tests, when the database went away

    def call(self, action: Callable[[QueueStore], T]) -> T | None:
        """One call on the queue; None when the database is away (it is reconnected on the
        next call)."""
        self.gone = False
        try:
            if self.store is None:
                self.store = QueueStore(self.url, self.run_id)
            result = action(self.store)
        except (DevpoolError, driver().Error) as exc:
            if self.store is not None:
                with contextlib.suppress(Exception):
                    self.store.close()
            self.store = None
            now = time.monotonic()
            self.down_since = self.down_since or now
            if now - self.down_since > self.lease:
                self.gone = True
                self.failure = f"queue: PostgreSQL at {where(self.url)} was away for more than "
                self.failure += f"{self.lease:g}s, this job took no more tests ({exc})"
            return None
        self.down_since = None
        return result

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
