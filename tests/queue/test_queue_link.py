"""QueueLink (queue/link.py): a job's link to the queue's database outlives the database
going away for less than a lease; past it, the job is `gone` with one sentence saying why.
The store is a fake and the clock is set by hand: no PostgreSQL here."""

from __future__ import annotations

from typing import Any

import pytest

from devpool.errors import DevpoolError
from devpool.queue import link
from devpool.queue.link import QueueLink

URL = "postgresql://ci:hunter2@db.example:5432/queue"


class Store:
    made: list[Store] = []

    def __init__(self, url: str = URL, run_id: str = "run-1") -> None:
        self.url, self.run_id, self.closed = url, run_id, False
        Store.made.append(self)

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(link.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(link, "QueueStore", Store)
    Store.made = []
    return clock


def _away(store: Any) -> None:
    raise DevpoolError("the database closed the connection")


def test_a_call_answers_what_the_store_answers(clock: Clock) -> None:
    store = Store()
    queue = QueueLink(URL, "run-1", 30.0, store)  # type: ignore[arg-type]
    assert queue.call(lambda s: ("asked", s)) == ("asked", store)
    assert queue.down_since is None and not queue.gone


def test_a_short_absence_answers_none_and_the_next_call_connects_again(clock: Clock) -> None:
    first = Store()
    queue = QueueLink(URL, "run-1", 30.0, first)  # type: ignore[arg-type]
    assert queue.call(_away) is None
    assert first.closed and queue.store is None and queue.down_since == 100.0
    assert not queue.gone and queue.failure == ""
    clock.now = 120.0
    assert queue.call(lambda s: s) is Store.made[-1]
    assert Store.made[-1] is not first and (Store.made[-1].url, Store.made[-1].run_id) == (
        URL,
        "run-1",
    )
    assert queue.down_since is None


def test_an_absence_longer_than_a_lease_is_gone_with_one_sentence(clock: Clock) -> None:
    queue = QueueLink(URL, "run-1", 30.0, Store())  # type: ignore[arg-type]
    assert queue.call(_away) is None
    clock.now = 130.0  # away for the lease exactly: not yet
    assert queue.call(_away) is None and not queue.gone
    clock.now = 131.0
    assert queue.call(_away) is None and queue.gone
    assert queue.failure == (
        "queue: PostgreSQL at db.example:5432 was away for more than 30s, this job took no "
        "more tests (the database closed the connection)"
    )
    assert "hunter2" not in queue.failure
    assert queue.call(lambda s: "back") == "back" and not queue.gone  # it came back


def test_closing_closes_the_store_it_holds(clock: Clock) -> None:
    store = Store()
    queue = QueueLink(URL, "run-1", 30.0, store)  # type: ignore[arg-type]
    queue.close()
    assert store.closed
    queue.call(_away)
    queue.close()  # no store held: nothing to close, no error
