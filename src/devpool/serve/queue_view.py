"""The queue view of `devpool serve --devpool-queue=URL`: the runs many CI jobs share.

Given a run (--devpool-queue-run) it shows that run; otherwise the newest NEWEST runs on the
database. Each run is the RunStatus `devpool queue status` prints (queue/status.py): tests by
state and outcome, each job (host, devices, alive, lost or left, claimed, done), what is still
queued and what of it no live job can hold.

The database is asked in a thread of its own, at most every ASK_SECONDS and only while someone
reads the page or its events, so a database that does not answer is a line on the page, never
a page that waits; after a failure the next question reconnects, RETRY_SECONDS later. Nothing
is written: a job whose lease ran out shows lost, as the next job's reap will mark it.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from devpool.database import where
from devpool.errors import DevpoolError
from devpool.queue.rows import TestRow
from devpool.queue.status import SCHEMA, run_status
from devpool.queue.store import QueueStore

ASK_SECONDS = 2.0
RETRY_SECONDS = 3.0
NEWEST = 5  # runs shown when no run is named

Reader = Callable[[], list[dict[str, Any]]]


@dataclass(frozen=True)
class QueueAnswer:
    """What one question to the database brought back (or the one sentence why nothing did)."""

    at: float  # time.monotonic(): when the next question is due
    time: float  # time.time(), for the page
    runs: tuple[dict[str, Any], ...]
    problem: str | None = None

    def signature(self) -> tuple[Any, ...]:
        return (self.problem, json.dumps(self.runs, sort_keys=True))


class QueueWatch:
    """The queue's last answer, asked again in the background when due."""

    def __init__(self, url: str, run_id: str | None = None) -> None:
        self.url = url
        self.run_id = run_id
        self.database = where(url)
        self._store: QueueStore | None = None
        self._ended: dict[str, list[TestRow]] = {}  # a run whose every test is done stays so
        self._answer: QueueAnswer | None = None
        self._asking = False
        self._lock = threading.Lock()

    def answer(self) -> QueueAnswer | None:
        """The last answer (None before the first); a question goes out when one is due.
        Never waits for the database."""
        with self._lock:
            answer = self._answer
            wait = RETRY_SECONDS if answer is not None and answer.problem else ASK_SECONDS
            due = answer is None or time.monotonic() - answer.at >= wait
            if due and not self._asking:
                self._asking = True
                threading.Thread(
                    target=self._question, name="devpool-serve-queue", daemon=True
                ).start()
            return answer

    def signature(self) -> tuple[Any, ...]:
        answer = self.answer()
        return () if answer is None else answer.signature()

    def view(self) -> dict[str, Any]:
        """The queue view: the database (host:port, never the URL's password), the run asked
        for, when it answered, its problem, and each run's status."""
        answer = self.answer()
        return {
            "schema": SCHEMA,
            "database": self.database,
            "run": self.run_id,
            "answered": answer.time if answer is not None else None,
            "problem": answer.problem if answer is not None else None,
            "runs": list(answer.runs) if answer is not None else [],
        }

    def close(self) -> None:
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()

    def _question(self) -> None:
        try:
            answer = QueueAnswer(time.monotonic(), time.time(), tuple(self._read()))
        except Exception as exc:  # noqa: BLE001 - any failure of the database is one sentence
            self.close()  # the next question connects again
            answer = QueueAnswer(time.monotonic(), time.time(), (), self._problem(exc))
        with self._lock:
            self._answer = answer
            self._asking = False

    def _problem(self, exc: BaseException) -> str:
        if isinstance(exc, DevpoolError):
            return str(exc)
        lines = str(exc).strip().splitlines()
        why = lines[0] if lines else type(exc).__name__
        return f"PostgreSQL at {self.database} did not answer: {why}"

    def _read(self) -> list[dict[str, Any]]:
        if self._store is None:
            self._store = QueueStore(self.url, self.run_id or "", read_only=True)
        store = self._store
        if self.run_id is None:
            runs: list[tuple[str, float | None]] = list(store.newest_runs(NEWEST))
        elif store.published():
            runs = [(self.run_id, None)]
        else:
            raise DevpoolError(
                f"queue run {self.run_id!r} at {self.database} was never started: no job of "
                "it has reached the queue yet"
            )
        self._ended = {r: rows for r, rows in self._ended.items() if r in dict(runs)}
        out = []
        for run_id, published in runs:
            run = store.of_run(run_id)
            rows = self._ended.get(run_id) or run.tests()
            status = run_status(run_id, run.jobs(), rows, run.lapsed())
            if status.finished:
                self._ended[run_id] = rows
            out.append({**status.to_json(), "published": published})
        return out
