"""Duration history in SQLite, the default: every test's outcome and duration per run, in a
file under .devpool/ (the queries are sql.py's, shared with a PostgreSQL history).

Estimates are the p90 (nearest rank) of a test's most recent durations, counting only
runs that ran the test to its end (passed, failed, flaky): a skip or a timeout says
nothing about how long the test takes. `export` writes a plain JSON-lines file and
`merge` reads one back (or another history file), so CI runners can pool timings
without a server. The file carries its schema version; a newer one is refused.

Schema 2 adds each result's peak device memory (bytes, the most on any one device, NULL
when the test's memory was not watched). Schema 3 adds each device test's CPU load: the
cores its process and children kept busy or waiting to run, on average over the test
(NULL for CPU-only tests and where unmeasured); the scheduler gives a device test that
keeps cores busy CPU slots as well as devices (`cpu_slots_of`). Schema 4 adds how many
things each result's test left behind (issue 52: processes, threads, device memory; NULL
where the run did not look), so the tests view names a test that leaks run after run.
An older history is migrated in place when it is opened for writing (one ALTER TABLE per
schema, every row kept, NULL for what it did not record); an older history or export read
as a merge source gives results without them.

Pending results: a shard run must not change the history the other shards of its CI run
split from, so it writes its results to a per-run file, `<history stem>.d/<run id>.jsonl`
beside the history (export format), never to the history itself. Estimates never read
pending files. `devpool history merge` with no file folds them in; a run that is not a
shard folds them in before it reads its estimates (it needs no pinned snapshot).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from devpool.errors import DevpoolError
from devpool.folders import made
from devpool.history.results import (
    COUNTED_OUTCOMES,
    EXPORT_FORMAT,
    HISTORY_SCHEMA,
    TestResult,
    p90,
    read_export,
    results_bound,
    runner_class,
    wall_bound,
    write_export,
)
from devpool.history.sql import COLUMNS, CREATE_RESULTS, FIXED_WINDOW, SqlHistory

__all__ = [  # what callers imported from here before results.py and sql.py were split off
    "COUNTED_OUTCOMES",
    "EXPORT_FORMAT",
    "FIXED_WINDOW",
    "HISTORY_SCHEMA",
    "History",
    "TestResult",
    "default_history_path",
    "p90",
    "pending_dir",
    "pending_files",
    "results_bound",
    "runner_class",
    "wall_bound",
    "write_export",
    "write_pending",
]

# PRAGMA application_id: tells a devpool history from any other SQLite file ("dpol").
_APPLICATION_ID = 0x64706F6C
SQLITE_MAGIC = b"SQLite format 3\x00"
_CREATE = CREATE_RESULTS.format(table="results", key="")
# An older file (a read-only merge source) lacks the later columns: unknown, as NULL.
_COLUMNS_OF = {
    1: COLUMNS.replace("memory_peak", "NULL")
    .replace("cpu_load", "NULL")
    .replace(", leaks", ", NULL"),
    2: COLUMNS.replace("cpu_load", "NULL").replace(", leaks", ", NULL"),
    3: COLUMNS.replace(", leaks", ", NULL"),
}
_MIGRATIONS = {  # from version → next
    1: "ALTER TABLE results ADD COLUMN memory_peak INTEGER",
    2: "ALTER TABLE results ADD COLUMN cpu_load REAL",
    3: "ALTER TABLE results ADD COLUMN leaks INTEGER",
}


def default_history_path(root: Path) -> Path:
    """Where a project keeps its history: ROOT/.devpool/history.sqlite."""
    return root / ".devpool" / "history.sqlite"  # made with the run folder (folders.py)


def pending_dir(history_path: Path) -> Path:
    """The folder of a history's pending per-run files: .devpool/history.d for the default."""
    return history_path.parent / f"{history_path.stem}.d"


def pending_files(history_path: Path) -> list[Path]:
    """The pending per-run files of a history, oldest run first (run ids sort by time)."""
    folder = pending_dir(history_path)
    return sorted(folder.glob("*.jsonl")) if folder.is_dir() else []


def write_pending(history_path: Path, run_id: str, results: Iterable[TestResult]) -> Path:
    """A shard run's results as a pending per-run file beside the history; returns its path."""
    path = pending_dir(history_path) / f"{run_id}.jsonl"
    write_export(path, results)
    return path


def _connect(path: Path, create: bool) -> sqlite3.Connection:
    """An open devpool history, created when empty (if allowed); DevpoolError otherwise."""
    try:
        if create:
            made(path.parent)
        elif not path.is_file():
            raise DevpoolError(f"history {path} does not exist")
        uri = path.resolve().as_uri() + ("" if create else "?mode=ro")
        conn = sqlite3.connect(uri, uri=True, timeout=30.0, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        raise DevpoolError(f"cannot open history {path}: {exc}") from None
    try:
        application_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if tables == 0 and application_id == 0 and create:
            conn.execute("BEGIN IMMEDIATE")
            conn.executescript(_CREATE)  # commits the transaction
            conn.execute(f"PRAGMA application_id = {_APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {HISTORY_SCHEMA}")
            return conn
    except sqlite3.Error as exc:
        conn.close()
        raise DevpoolError(f"{path} is not a devpool history ({exc})") from None
    if application_id != _APPLICATION_ID:
        conn.close()
        raise DevpoolError(f"{path} is not a devpool history (it is another program's database)")
    if version > HISTORY_SCHEMA:
        conn.close()
        raise DevpoolError(
            f"history {path} was written by a newer devpool (schema {version}); "
            f"this one reads {HISTORY_SCHEMA}"
        )
    if version < 1:
        conn.close()
        raise DevpoolError(f"{path} is not a devpool history (it has no schema version)")
    if version < HISTORY_SCHEMA and create:
        _migrate(conn, path)
    return conn


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Bring an older history up to HISTORY_SCHEMA in place, in one transaction (rows kept)."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have migrated it between our look and our lock.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            while version < HISTORY_SCHEMA:
                conn.execute(_MIGRATIONS[version])
                version += 1
            conn.execute(f"PRAGMA user_version = {HISTORY_SCHEMA}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        if "readonly" in str(exc):  # a read-only copy still gives its estimates, as before
            return
        conn.close()
        raise DevpoolError(
            f"cannot upgrade history {path} to schema {HISTORY_SCHEMA}: {exc}"
        ) from None


def _columns_of(conn: sqlite3.Connection) -> str:
    """The SELECT list for this file's schema (an older source lacks later columns)."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    return _COLUMNS_OF.get(version, COLUMNS)


class History(SqlHistory):
    """The duration history in a SQLite file.

    ``read_only``: opened with SQLite's mode=ro, never created, migrated or written (what
    `devpool serve` reads)."""

    def __init__(self, path: Path, read_only: bool = False) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        self._conn = _connect(self.path, create=not read_only)
        if not read_only:
            # The newest rows first, without sorting the whole table: what a run's start reads
            # to guess the kinds it will need (session/early_kinds.py).
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("CREATE INDEX IF NOT EXISTS results_by_time ON results (time)")
        self._select = _columns_of(self._conn)

    @property
    def _errors(self) -> tuple[type[Exception], ...]:
        return (sqlite3.Error,)

    def _unreadable(self, exc: Exception) -> str:
        return f"{self.path} is not a devpool history ({exc})"

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _has_run_costs(self) -> bool:
        sql = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'run_costs'"
        return bool(self._rows(sql)[0][0])

    def add_pending(self, run_id: str, results: Iterable[TestResult]) -> str:
        """A per-run file beside the history (pending_dir)."""
        return str(write_pending(self.path, run_id, results))

    def pending_where(self) -> str:
        return f"pending run files in {pending_dir(self.path)}"

    def merge_pending(self) -> tuple[int, Sequence[Path]]:
        """Fold in every pending per-run file, removing each once added: (new rows, files)."""
        added, merged = 0, []
        for path in pending_files(self.path):
            added += self.add(read_export(path))
            # Another run may have folded it in meanwhile: it is gone either way.
            path.unlink(missing_ok=True)
            merged.append(path)
        return added, merged

    def close(self) -> None:
        self._conn.close()


def read_sqlite(source: Path) -> list[TestResult]:
    """Every result of another history file (any schema this devpool reads)."""
    with History(source, read_only=True) as other:
        return list(other.results())
