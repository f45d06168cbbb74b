"""Duration history in PostgreSQL: one fleet's history, shared by every runner that names it
(`--devpool-history=postgresql://…`), so a new runner starts with the fleet's figures.

Its tables live in their own schema, `devpool_history`, beside whatever else the database
holds (the shared queue's tables): `results` and `run_costs` as in a SQLite history (the
queries are sql.py's), `pending` for shard runs' results until they are folded in (estimates
never read it; a file history keeps them in per-run files), and `meta` with the schema
version. The first runner to open an empty database makes them, under an advisory lock;
the first to open an older one upgrades it there (schema 4 adds each result's leaks).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from devpool.database import FLEET_SCHEMA as SCHEMA
from devpool.database import connect, driver, shown, tables_version, under_lock
from devpool.errors import DevpoolError
from devpool.history.results import HISTORY_SCHEMA, TestResult
from devpool.history.sql import COLUMNS, CREATE_RESULTS, CREATE_RUN_COSTS, SqlHistory

_LOCK = 0x64706F6C68  # pg_advisory_xact_lock key: two runners making the tables at once
_KEY = "rowid BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,\n    "
_CREATE = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
SET search_path TO {SCHEMA};
{CREATE_RESULTS.format(table="results", key=_KEY)}
{CREATE_RESULTS.format(table="pending", key=_KEY)}
CREATE INDEX IF NOT EXISTS results_by_time ON results (time);
CREATE INDEX IF NOT EXISTS pending_by_run ON pending (run_id);
{CREATE_RUN_COSTS};
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS shard_splits (
    split TEXT PRIMARY KEY, estimates TEXT NOT NULL, made TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO meta VALUES ('schema', '{HISTORY_SCHEMA}') ON CONFLICT DO NOTHING;
"""
# From a version → the next, under the same lock (PostgreSQL histories began at schema 3).
_UPGRADES = {
    3: "ALTER TABLE results ADD COLUMN IF NOT EXISTS leaks INTEGER;\n"
    "ALTER TABLE pending ADD COLUMN IF NOT EXISTS leaks INTEGER",
}
# The columns an older history has, read only (its rows say nothing of what came later).
_COLUMNS_OF = {3: COLUMNS.replace(", leaks", ", NULL")}
# Pending rows of the runs named move to results in one statement: a run folded in twice
# (two runners at once) adds its rows once.
_FOLD = f"""
WITH moved AS (DELETE FROM pending WHERE run_id = ANY(%s) RETURNING {COLUMNS})
INSERT INTO results ({COLUMNS}) SELECT {COLUMNS} FROM moved ON CONFLICT DO NOTHING
"""


class PostgresHistory(SqlHistory):
    """The duration history in a PostgreSQL database (a postgresql:// URL).

    ``read_only``: its tables are never made; a database without them is refused."""

    def __init__(self, url: str, read_only: bool = False, option: str = "--devpool-history"):
        self.url = url
        self.where = shown(url)
        self._psycopg = driver(option)
        self._conn = connect(url, option)
        try:
            self._conn.execute(f"SET search_path TO {SCHEMA}")
            version = self._version()
            if version < HISTORY_SCHEMA and not read_only:
                # Made once, under a lock: a fleet's runners open it at every run, and
                # CREATE … IF NOT EXISTS would still lock the tables they write.
                with under_lock(self._conn, _LOCK) as conn:
                    conn.execute(_CREATE)
                    self._upgrade(conn)
                version = self._version()
        except self._psycopg.Error as exc:
            self._conn.close()
            said = _said(exc)
            raise DevpoolError(f"{option}: cannot open the history {self.where}: {said}") from None
        if version == 0:
            self._conn.close()
            raise DevpoolError(f"{option} {self.where} holds no devpool history yet")
        if version > HISTORY_SCHEMA:
            self._conn.close()
            raise DevpoolError(
                f"history {self.where} was written by a newer devpool (schema {version}); "
                f"this one reads {HISTORY_SCHEMA}"
            )
        self._select = _COLUMNS_OF.get(version, COLUMNS)

    def _upgrade(self, conn: Any) -> None:
        """Bring an older history up to HISTORY_SCHEMA (every row kept, NULL for what it did
        not record); another runner may have done it first, under the same lock."""
        version = self._version()
        while 0 < version < HISTORY_SCHEMA:
            conn.execute(_UPGRADES[version])
            version += 1
        conn.execute("UPDATE meta SET value = %s WHERE key = 'schema'", (str(HISTORY_SCHEMA),))

    def _version(self) -> int:
        """The schema of the history in this database; 0 where there is none yet."""
        return tables_version(self._conn, f"{SCHEMA}.meta") or 0

    @property
    def _errors(self) -> tuple[type[Exception], ...]:
        return (self._psycopg.Error,)

    def _unreadable(self, exc: Exception) -> str:
        return f"cannot read history {self.where}: {_said(exc)}"

    def _dialect(self, sql: str) -> str:
        """SQLite's ? placeholders as psycopg's %s; a literal % kept literal (%%). The shared
        queries hold no literal ? (tests/history/test_history_pg.py checks them all)."""
        return sql.replace("%", "%%").replace("?", "%s")

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        with self._conn.transaction():
            yield self._conn

    def _has_run_costs(self) -> bool:
        return True  # made with the other tables

    def add_pending(self, run_id: str, results: Iterable[TestResult]) -> str:
        """Rows of the `pending` table under the run's id."""
        self._insert("pending", results)
        return f"{self.where} (pending run {run_id})"

    def pending_where(self) -> str:
        return f"pending runs in {self.where}"

    def merge_pending(self) -> tuple[int, Sequence[str]]:
        """Move every pending run's rows into results: (new rows, the runs' ids)."""
        runs = [str(r[0]) for r in self._rows("SELECT DISTINCT run_id FROM pending ORDER BY 1")]
        if not runs:
            return 0, []
        try:
            with self._transaction() as conn:
                added = conn.execute(_FOLD, (runs,)).rowcount
        except self._psycopg.Error as exc:
            raise DevpoolError(f"cannot add to history {self.where}: {exc}") from None
        return max(int(added), 0), runs

    def pinned(self, split: str, estimates: Mapping[str, Any]) -> dict[str, Any]:
        """The estimates the first shard of `split` read (these, when it is the first): the
        fleet's runs change this history while a CI run's shards start, and shards that
        split from different figures would run a test twice, or never."""
        try:
            with self._transaction() as conn:
                conn.execute(
                    "INSERT INTO shard_splits (split, estimates) VALUES (%s, %s) "
                    "ON CONFLICT DO NOTHING",
                    (split, json.dumps(estimates)),
                )
                row = conn.execute(
                    "SELECT estimates FROM shard_splits WHERE split = %s", (split,)
                ).fetchone()
        except self._psycopg.Error as exc:
            raise DevpoolError(self._unreadable(exc)) from None
        return dict(json.loads(row[0]))

    def close(self) -> None:
        self._conn.close()


def _said(exc: Exception) -> str:
    """The first line of what the server said (psycopg adds context lines)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
