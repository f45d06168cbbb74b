"""The duration history's queries, written once for both of its databases.

SQLite (a file under .devpool/, the default) and PostgreSQL (a fleet's history, shared by
every runner) keep the same tables and answer the same SQL: `SqlHistory` asks them, and each
backend (durations.py, postgres.py) only opens its database, runs a transaction, and says in
one sentence why a query failed. Queries are written with `?` placeholders; PostgreSQL's
backend turns them into psycopg's `%s`.

Estimates can be asked for one platform: a test's durations measured there, and all of its
durations for a test never run there (a fleet mixes H100s and MI300s; the platform's name is
the device model a project gives it under [tool.devpool.platforms]).
"""

from __future__ import annotations

import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from devpool.errors import DevpoolError
from devpool.history.results import (
    COUNTED_OUTCOMES,
    TestResult,
    p90_by_test,
    write_export,
)

COLUMNS = (
    "nodeid, outcome, duration, platform, device_count, runner_class, time, run_id, "
    "memory_peak, cpu_load, leaks"
)
# `key`: PostgreSQL's own row number, named as SQLite's implicit one so the queries agree.
CREATE_RESULTS = """
CREATE TABLE IF NOT EXISTS {table} (
    {key}nodeid TEXT NOT NULL,
    outcome TEXT NOT NULL,
    duration DOUBLE PRECISION NOT NULL,
    platform TEXT NOT NULL,
    device_count INTEGER NOT NULL,
    runner_class TEXT NOT NULL,
    time DOUBLE PRECISION NOT NULL,
    run_id TEXT NOT NULL DEFAULT '',
    memory_peak BIGINT,
    cpu_load DOUBLE PRECISION,
    leaks INTEGER,
    UNIQUE (nodeid, run_id, time)
);
CREATE INDEX IF NOT EXISTS {table}_by_test ON {table} (nodeid, time);
"""
# A result recorded twice (same test, run id and time) is kept once.
INSERT = (
    f"INSERT INTO {{table}} ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT DO NOTHING"
)
_COUNTED = ", ".join(f"'{name}'" for name in COUNTED_OUTCOMES)

# Each test's counted rows, newest first, numbered per test.
_RANKED = f"""
SELECT nodeid, duration, run_id, rowid AS r,
       ROW_NUMBER() OVER (PARTITION BY nodeid ORDER BY time DESC, rowid DESC) AS rn
FROM results WHERE outcome IN ({_COUNTED}) {{where}}
"""
_LATEST = f"SELECT nodeid, duration FROM ({_RANKED}) AS ranked WHERE rn <= ?"
# The same, leaving out each test's latest run (every row of its run id, or its newest row).
_BEFORE_LATEST = f"""
WITH ranked AS ({_RANKED}),
latest AS (SELECT nodeid, run_id, r FROM ranked WHERE rn = 1),
rest AS (
    SELECT k.nodeid, k.duration, ROW_NUMBER() OVER (PARTITION BY k.nodeid ORDER BY k.rn) AS n
    FROM ranked k JOIN latest l ON k.nodeid = l.nodeid
    WHERE k.r != l.r AND (l.run_id = '' OR k.run_id != l.run_id)
)
SELECT nodeid, duration FROM rest WHERE n <= ?
"""
_PEAKS = """
SELECT nodeid, count(*), max(memory_peak) FROM (
    SELECT nodeid, memory_peak, ROW_NUMBER() OVER (
        PARTITION BY nodeid ORDER BY time DESC, rowid DESC) AS rn
    FROM results WHERE memory_peak IS NOT NULL
) AS ranked WHERE rn <= ? GROUP BY nodeid
"""
_CPU_LOADS = f"""
SELECT nodeid, cpu_load FROM (
    SELECT nodeid, cpu_load, ROW_NUMBER() OVER (
        PARTITION BY nodeid ORDER BY time DESC, rowid DESC) AS rn
    FROM results WHERE cpu_load IS NOT NULL AND outcome IN ({_COUNTED}) {{where}}
) AS ranked WHERE rn <= ?
"""

# What a run cost beyond its tests' own time: its wall against the bound its tests' durations
# give (wall_bound), per platform and pool size. Start-up, collection, the gaps between
# phases and the exit are in the difference; capacity and shard add its recent median.
# Written beside `results` by runs that write the history itself (not by shard runs' pending
# results); a SQLite history without the table (an older devpool's) has no fixed costs yet.
CREATE_RUN_COSTS = """
CREATE TABLE IF NOT EXISTS run_costs (
    run_id TEXT NOT NULL,
    platform TEXT NOT NULL,
    devices INTEGER NOT NULL,
    tests INTEGER NOT NULL,
    wall DOUBLE PRECISION NOT NULL,
    bound DOUBLE PRECISION NOT NULL,
    time DOUBLE PRECISION NOT NULL
)
"""
FIXED_WINDOW = 5  # runs whose fixed cost is taken, their median


class SqlHistory(ABC):
    """The duration history of one project: add results, ask estimates, move it as a file.

    A backend opens `_conn` (whose `execute(sql, params)` returns rows to iterate, as
    sqlite3's and psycopg's do) and gives the rest below."""

    where: str  # the file or the database, as sentences name it
    _conn: Any
    _select: str = COLUMNS  # the columns this history has (an older SQLite file lacks some)

    @property
    @abstractmethod
    def _errors(self) -> tuple[type[Exception], ...]:
        """The database driver's errors."""

    @abstractmethod
    def _transaction(self) -> AbstractContextManager[Any]:
        """A write transaction, committed when its block ends and rolled back on an error."""

    @abstractmethod
    def _unreadable(self, exc: Exception) -> str:
        """The sentence for a query that failed."""

    def _dialect(self, sql: str) -> str:
        """The SQL as this database's driver writes placeholders."""
        return sql

    @abstractmethod
    def _has_run_costs(self) -> bool:
        """Whether the run_costs table exists (an older SQLite history has none)."""

    @abstractmethod
    def add_pending(self, run_id: str, results: Iterable[TestResult]) -> str:
        """A shard run's results, kept apart until folded in; returns where they went."""

    @abstractmethod
    def merge_pending(self) -> tuple[int, Sequence[str | Path]]:
        """Fold in every shard run's pending results: (new rows, the runs folded in)."""

    @abstractmethod
    def pending_where(self) -> str:
        """Where pending runs wait, for sentences ('pending run files in …')."""

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> SqlHistory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return [tuple(row) for row in self._conn.execute(self._dialect(sql), params)]
        except self._errors as exc:
            raise DevpoolError(self._unreadable(exc)) from None

    def _insert(self, table: str, results: Iterable[TestResult]) -> int:
        """Add results to a table of result rows; returns how many were new."""
        rows = [result.row() for result in results]
        if not rows:
            return 0
        try:
            with self._transaction():
                cursor = self._conn.cursor()
                cursor.executemany(self._dialect(INSERT.format(table=table)), rows)
                return max(int(cursor.rowcount), 0)
        except self._errors as exc:  # locked past the timeout, disk full, read-only, gone
            raise DevpoolError(f"cannot add to history {self.where}: {exc}") from None

    def add(self, results: Iterable[TestResult]) -> int:
        """Append results; a result already recorded (same test, run id and time) is kept once.
        Returns how many were new."""
        return self._insert("results", results)

    def _per_test(
        self, query: str, window: int, platform: str | None, nodeid: str | None
    ) -> dict[str, float]:
        """p90 of each test's rows a ranked query gives; with a platform, of its rows there
        where it has any."""
        test, params = ("AND nodeid = ?", [nodeid]) if nodeid is not None else ("", [])
        found = p90_by_test(self._durations(query.format(where=test), (*params, window)))
        if platform is not None:
            there = query.format(where=f"{test} AND platform = ?")
            found.update(p90_by_test(self._durations(there, (*params, platform, window))))
        return found

    def _durations(self, sql: str, params: Sequence[Any]) -> list[tuple[str, float]]:
        return [(str(n), float(d)) for n, d in self._rows(sql, params)]

    def estimate(self, nodeid: str, window: int = 20, platform: str | None = None) -> float | None:
        """p90 of the test's last `window` counted durations; None when it has none."""
        return self._per_test(_LATEST, window, platform, nodeid).get(nodeid)

    def estimates(self, window: int = 20, platform: str | None = None) -> dict[str, float]:
        """estimate() of every test with history, in one query (two with a platform)."""
        return self._per_test(_LATEST, window, platform, None)

    def previous(self, nodeid: str, window: int = 20, platform: str | None = None) -> float | None:
        """The estimate as it was before the test's latest run (to see drift); None without one."""
        return self._per_test(_BEFORE_LATEST, window, platform, nodeid).get(nodeid)

    def previous_estimates(self, window: int = 20, platform: str | None = None) -> dict[str, float]:
        """previous() of every test that has one."""
        return self._per_test(_BEFORE_LATEST, window, platform, None)

    def results(self) -> Iterator[TestResult]:
        """Every stored result, oldest first."""
        sql = f"SELECT {self._select} FROM results ORDER BY time, rowid"
        for row in self._rows(sql):
            yield TestResult(*row)

    def recent(self, platform: str, limit: int) -> list[tuple[str, int, float]]:
        """(test, devices, duration) of the newest `limit` results on a platform."""
        sql = (
            "SELECT nodeid, device_count, duration FROM results WHERE platform = ? "
            "ORDER BY time DESC LIMIT ?"
        )
        return [(str(n), int(c), float(d)) for n, c, d in self._rows(sql, (platform, limit))]

    def peaks(self, window: int = 20) -> dict[str, tuple[int, int]]:
        """(results with a peak, highest peak in bytes) of each test's last `window` watched
        results, any outcome: an overrun's peak is what the test really needs."""
        if "memory_peak" not in self._select.split(", "):
            return {}  # a read-only schema 1 copy has no peaks
        return {str(n): (int(c), int(p)) for n, c, p in self._rows(_PEAKS, (window,))}

    def cpu_loads(self, window: int = 20, platform: str | None = None) -> dict[str, float]:
        """The median CPU load (cores) of each device test's last `window` measured results
        that ran to their end (on the platform, where it has any); tests never measured are
        absent."""
        if "cpu_load" not in self._select.split(", "):
            return {}  # a read-only copy of an older schema measured none
        found = _medians(self._rows(_CPU_LOADS.format(where=""), (window,)))
        if platform is not None:
            there = _CPU_LOADS.format(where="AND platform = ?")
            found.update(_medians(self._rows(there, (platform, window))))
        return found

    def recent_outcomes(
        self, nodeid: str, count: int, newer: Iterable[TestResult] = ()
    ) -> list[str]:
        """One test's last `count` outcomes, newest first (uses the per-test index).

        `newer`: results not in this history (a shard run's pending ones), counted first.
        """
        ahead = sorted((r for r in newer if r.nodeid == nodeid), key=lambda r: -r.time)
        sql = "SELECT outcome FROM results WHERE nodeid = ? ORDER BY time DESC, rowid DESC LIMIT ?"
        stored = [str(row[0]) for row in self._rows(sql, (nodeid, count))]
        return ([r.outcome for r in ahead] + stored)[:count]

    def export(self, out: Path) -> int:
        """Write every result as JSON lines after a header line; returns the rows written."""
        return write_export(out, list(self.results()))

    def pinned(self, split: str, estimates: Mapping[str, Any]) -> dict[str, Any]:
        """The estimates the shards of one CI run split from (`split` names it): these. A
        file history is each runner's own copy, unchanged while the shards start; a shared
        database pins the first shard's (postgres.py)."""
        return dict(estimates)

    def add_run_cost(
        self, run_id: str, platform: str, devices: int, tests: int, wall: float, bound: float
    ) -> None:
        """What this run of `tests` tests took against their bound (see CREATE_RUN_COSTS)."""
        row = (run_id, platform, devices, tests, wall, bound, time.time())
        insert = self._dialect("INSERT INTO run_costs VALUES (?, ?, ?, ?, ?, ?, ?)")
        try:
            with self._transaction() as conn:
                conn.execute(CREATE_RUN_COSTS)
                conn.execute(insert, row)
        except self._errors as exc:
            raise DevpoolError(f"cannot add to history {self.where}: {exc}") from None

    def fixed_cost(self, platform: str, devices: int, tests: int) -> tuple[float, int]:
        """The median of wall - bound over the latest runs on this platform and pool size of
        about as many tests (half to twice: a single-test run's start-up says little of a
        suite's), and how many runs it is of: (0.0, 0) when none was recorded."""
        if not self._has_run_costs():
            return 0.0, 0  # an older devpool wrote this history
        rows = self._rows(
            "SELECT wall - bound FROM run_costs WHERE platform = ? AND devices = ? "
            "AND tests * 2 >= ? AND tests <= ? * 2 ORDER BY time DESC LIMIT ?",
            (platform, devices, tests, tests, FIXED_WINDOW),
        )
        costs = sorted(max(0.0, float(r[0])) for r in rows)
        if not costs:
            return 0.0, 0
        return statistics.median(costs), len(costs)


def _medians(rows: Iterable[tuple[Any, ...]]) -> dict[str, float]:
    grouped: dict[str, list[float]] = {}
    for nodeid, load in rows:
        grouped.setdefault(str(nodeid), []).append(float(load))
    return {nodeid: statistics.median(loads) for nodeid, loads in grouped.items()}
