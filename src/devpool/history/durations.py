"""Duration history: every test's outcome and duration per run, in SQLite under .devpool/.

Estimates are the p90 (nearest rank) of a test's most recent durations, counting only
runs that ran the test to its end (passed, failed, flaky): a skip or a timeout says
nothing about how long the test takes. `export` writes a plain JSON-lines file and
`merge` reads one back (or another history file), so CI runners can pool timings
without a server. The file carries its schema version; a newer one is refused.

Schema 2 adds each result's peak device memory (bytes, the most on any one device, NULL
when the test's memory was not watched). Schema 3 adds each device test's CPU load: the
cores its process and children kept busy or waiting to run, on average over the test
(NULL for CPU-only tests and where unmeasured); the scheduler gives a device test that
keeps cores busy CPU slots as well as devices (`cpu_slots_of`). An older history is
migrated in place when it is opened for writing (one ALTER TABLE per schema, every row
kept, NULL for what it did not record); an older history or export read as a merge source
gives results without them.

Pending results: a shard run must not change the history the other shards of its CI run
split from, so it writes its results to a per-run file, `<history stem>.d/<run id>.jsonl`
beside the history (export format), never to the history itself. Estimates never read
pending files. `devpool history merge` with no file folds them in; a run that is not a
shard folds them in before it reads its estimates (it needs no pinned snapshot).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import statistics
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from devpool.errors import DevpoolError
from devpool.folders import made

HISTORY_SCHEMA = 3
EXPORT_FORMAT = "devpool-history"
COUNTED_OUTCOMES = ("passed", "failed", "flaky")
# PRAGMA application_id: tells a devpool history from any other SQLite file ("dpol").
_APPLICATION_ID = 0x64706F6C
_SQLITE_MAGIC = b"SQLite format 3\x00"

_CREATE = """
CREATE TABLE IF NOT EXISTS results (
    nodeid TEXT NOT NULL,
    outcome TEXT NOT NULL,
    duration REAL NOT NULL,
    platform TEXT NOT NULL,
    device_count INTEGER NOT NULL,
    runner_class TEXT NOT NULL,
    time REAL NOT NULL,
    run_id TEXT NOT NULL DEFAULT '',
    memory_peak INTEGER,
    cpu_load REAL,
    UNIQUE (nodeid, run_id, time)
);
CREATE INDEX IF NOT EXISTS results_by_test ON results (nodeid, time);
"""
_COLUMNS = (
    "nodeid, outcome, duration, platform, device_count, runner_class, time, run_id, "
    "memory_peak, cpu_load"
)
# An older file (a read-only merge source) lacks the later columns: unknown, as NULL.
_COLUMNS_OF = {
    1: _COLUMNS.replace("memory_peak", "NULL").replace("cpu_load", "NULL"),
    2: _COLUMNS.replace("cpu_load", "NULL"),
}
_INSERT = f"INSERT OR IGNORE INTO results ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_MIGRATIONS = {  # from version → next
    1: "ALTER TABLE results ADD COLUMN memory_peak INTEGER",
    2: "ALTER TABLE results ADD COLUMN cpu_load REAL",
}
_COUNTED = ", ".join(f"'{name}'" for name in COUNTED_OUTCOMES)

# Each test's counted rows, newest first, numbered per test.
_RANKED = f"""
SELECT nodeid, duration, run_id, rowid AS r,
       ROW_NUMBER() OVER (PARTITION BY nodeid ORDER BY time DESC, rowid DESC) AS rn
FROM results WHERE outcome IN ({_COUNTED}) {{where}}
"""
_LATEST = f"SELECT nodeid, duration FROM ({_RANKED}) WHERE rn <= ?"
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


# What a run cost beyond its tests' own time: its wall against the bound its tests' durations
# give (wall_bound), per platform and pool size. Start-up, collection, the gaps between
# phases and the exit are in the difference; capacity and shard add its recent median.
# Written beside `results` by runs that write the history itself (not by shard runs' pending
# files); a history without the table (an older devpool's) has no fixed costs yet.
_RUN_COSTS = """
CREATE TABLE IF NOT EXISTS run_costs (
    run_id TEXT NOT NULL,
    platform TEXT NOT NULL,
    devices INTEGER NOT NULL,
    tests INTEGER NOT NULL,
    wall REAL NOT NULL,
    bound REAL NOT NULL,
    time REAL NOT NULL
)
"""
FIXED_WINDOW = 5  # runs whose fixed cost is taken, their median


def wall_bound(device_seconds: float, cpu_seconds: float, longest: float, devices: int) -> float:
    """The least wall a suite can take on one runner: its device-seconds (and CPU-seconds)
    spread over the devices, or its longest test."""
    slots = max(devices, 1)
    return max(device_seconds / slots, cpu_seconds / slots, longest)


def results_bound(results: Iterable[TestResult], devices: int) -> float:
    """wall_bound of a run's results."""
    device = cpu = longest = 0.0
    for result in results:
        device += result.duration * result.device_count
        cpu += result.duration if result.device_count == 0 else 0.0
        longest = max(longest, result.duration)
    return wall_bound(device, cpu, longest, devices)


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


def runner_class(platform: str, pool_size: int, environ: Mapping[str, str] = os.environ) -> str:
    """The runner class a result is filed under: $DEVPOOL_RUNNER_CLASS or '<platform>-<pool>'."""
    return environ.get("DEVPOOL_RUNNER_CLASS") or f"{platform}-{pool_size}"


@dataclass(frozen=True)
class TestResult:
    """One test's end in one run, as the history keeps it."""

    __test__ = False  # not a pytest test class, despite the name

    nodeid: str
    outcome: str
    duration: float
    platform: str
    device_count: int
    runner_class: str  # e.g. "sim-8", "cuda-8": $DEVPOOL_RUNNER_CLASS or f"{platform}-{pool size}"
    time: float  # Unix seconds
    run_id: str = ""
    memory_peak: int | None = None  # bytes, the most on any one device; None: not watched
    cpu_load: float | None = None  # cores kept busy or waiting, on average; None: unmeasured

    def row(self) -> tuple[Any, ...]:
        return (
            self.nodeid,
            self.outcome,
            float(self.duration),
            self.platform,
            int(self.device_count),
            self.runner_class,
            float(self.time),
            self.run_id,
            None if self.memory_peak is None else int(self.memory_peak),
            None if self.cpu_load is None else float(self.cpu_load),
        )


_FIELDS = {f.name: f.type for f in fields(TestResult)}


def p90(durations: Iterable[float]) -> float | None:
    """The nearest-rank 90th percentile, None for no durations."""
    ordered = sorted(durations)
    if not ordered:
        return None
    return ordered[max(math.ceil(0.9 * len(ordered)) - 1, 0)]


def _p90_by_test(rows: Iterable[tuple[str, float]]) -> dict[str, float]:
    grouped: dict[str, list[float]] = {}
    for nodeid, duration in rows:
        grouped.setdefault(nodeid, []).append(duration)
    return {nodeid: p90(values) or 0.0 for nodeid, values in grouped.items()}


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
    return _COLUMNS_OF.get(version, _COLUMNS)


class History:
    """The duration history of one project: add results, ask estimates, move it as a file.

    ``read_only``: opened with SQLite's mode=ro, never created, migrated or written (what
    `devpool serve` reads)."""

    def __init__(self, path: Path, read_only: bool = False) -> None:
        self.path = Path(path)
        self._conn = _connect(self.path, create=not read_only)
        if not read_only:
            # The newest rows first, without sorting the whole table: what a run's start reads
            # to guess the kinds it will need (session/early_kinds.py).
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("CREATE INDEX IF NOT EXISTS results_by_time ON results (time)")
        self._select = _columns_of(self._conn)

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[tuple[str, float]]:
        try:
            return [(str(n), float(d)) for n, d in self._conn.execute(sql, params)]
        except sqlite3.Error as exc:
            raise DevpoolError(f"{self.path} is not a devpool history ({exc})") from None

    def add(self, results: Iterable[TestResult]) -> None:
        """Append results; a result already recorded (same test, run id and time) is kept once."""
        try:
            with self._transaction() as conn:
                conn.executemany(_INSERT, (result.row() for result in results))
        except sqlite3.Error as exc:  # locked past the timeout, disk full, read-only file
            raise DevpoolError(f"cannot add to history {self.path}: {exc}") from None

    def estimate(self, nodeid: str, window: int = 20) -> float | None:
        """p90 of the test's last `window` counted durations; None when it has none."""
        rows = self._query(_LATEST.format(where="AND nodeid = ?"), (nodeid, window))
        return p90(d for _, d in rows)

    def estimates(self, window: int = 20) -> dict[str, float]:
        """estimate() of every test with history, in one query."""
        return _p90_by_test(self._query(_LATEST.format(where=""), (window,)))

    def previous(self, nodeid: str, window: int = 20) -> float | None:
        """The estimate as it was before the test's latest run (to see drift); None without one."""
        rows = self._query(_BEFORE_LATEST.format(where="AND nodeid = ?"), (nodeid, window))
        return p90(d for _, d in rows)

    def previous_estimates(self, window: int = 20) -> dict[str, float]:
        """previous() of every test that has one, in one query."""
        return _p90_by_test(self._query(_BEFORE_LATEST.format(where=""), (window,)))

    def results(self) -> Iterator[TestResult]:
        """Every stored result, oldest first."""
        sql = f"SELECT {self._select} FROM results ORDER BY time, rowid"
        for row in self._conn.execute(sql):
            yield TestResult(*row)

    def peaks(self, window: int = 20) -> dict[str, tuple[int, int]]:
        """(results with a peak, highest peak in bytes) of each test's last `window` watched
        results, any outcome: an overrun's peak is what the test really needs."""
        if "memory_peak" not in self._select.split(", "):
            return {}  # a read-only schema 1 copy has no peaks
        sql = """
        SELECT nodeid, count(*), max(memory_peak) FROM (
            SELECT nodeid, memory_peak, ROW_NUMBER() OVER (
                PARTITION BY nodeid ORDER BY time DESC, rowid DESC) AS rn
            FROM results WHERE memory_peak IS NOT NULL
        ) WHERE rn <= ? GROUP BY nodeid
        """
        try:
            rows = self._conn.execute(sql, (window,)).fetchall()
        except sqlite3.Error as exc:
            raise DevpoolError(f"{self.path} is not a devpool history ({exc})") from None
        return {str(n): (int(c), int(p)) for n, c, p in rows}

    def cpu_loads(self, window: int = 20) -> dict[str, float]:
        """The median CPU load (cores) of each device test's last `window` measured results
        that ran to their end; tests never measured are absent."""
        if "cpu_load" not in self._select.split(", "):
            return {}  # a read-only copy of an older schema measured none
        sql = f"""
        SELECT nodeid, cpu_load FROM (
            SELECT nodeid, cpu_load, ROW_NUMBER() OVER (
                PARTITION BY nodeid ORDER BY time DESC, rowid DESC) AS rn
            FROM results WHERE cpu_load IS NOT NULL AND outcome IN ({_COUNTED})
        ) WHERE rn <= ?
        """
        grouped: dict[str, list[float]] = {}
        try:
            for nodeid, load in self._conn.execute(sql, (window,)):
                grouped.setdefault(str(nodeid), []).append(float(load))
        except sqlite3.Error as exc:
            raise DevpoolError(f"{self.path} is not a devpool history ({exc})") from None
        return {nodeid: statistics.median(loads) for nodeid, loads in grouped.items()}

    def recent_outcomes(
        self, nodeid: str, count: int, newer: Iterable[TestResult] = ()
    ) -> list[str]:
        """One test's last `count` outcomes, newest first (uses the per-test index).

        `newer`: results not in this history (a shard run's pending ones), counted first.
        """
        ahead = sorted((r for r in newer if r.nodeid == nodeid), key=lambda r: -r.time)
        sql = "SELECT outcome FROM results WHERE nodeid = ? ORDER BY time DESC, rowid DESC LIMIT ?"
        stored = [row[0] for row in self._conn.execute(sql, (nodeid, count))]
        return ([r.outcome for r in ahead] + stored)[:count]

    def export(self, out: Path) -> int:
        """Write every result as JSON lines after a header line; returns the rows written."""
        return write_export(out, list(self.results()))

    def merge(self, source: Path) -> int:
        """Add the results of an export or another history file; returns the rows that were new."""
        source = Path(source)
        try:
            with open(source, "rb") as file:
                magic = file.read(len(_SQLITE_MAGIC))
        except OSError as exc:
            raise DevpoolError(f"cannot read {source}: {exc.strerror or exc}") from None
        if magic == _SQLITE_MAGIC:
            other = _connect(source, create=False)
            try:
                select = f"SELECT {_columns_of(other)} FROM results"
                results = [TestResult(*row) for row in other.execute(select)]
            except sqlite3.Error as exc:
                raise DevpoolError(f"{source} is not a devpool history ({exc})") from None
            finally:
                other.close()
        else:
            results = list(_read_export(source))
        before = self._conn.total_changes
        self.add(results)
        return self._conn.total_changes - before

    def merge_pending(self) -> tuple[int, list[Path]]:
        """Fold in every pending per-run file, removing each once added: (new rows, files)."""
        added, merged = 0, []
        for path in pending_files(self.path):
            added += self.merge(path)
            # Another run may have folded it in meanwhile: it is gone either way.
            path.unlink(missing_ok=True)
            merged.append(path)
        return added, merged

    def add_run_cost(
        self, run_id: str, platform: str, devices: int, tests: int, wall: float, bound: float
    ) -> None:
        """What this run of `tests` tests took against their bound (see _RUN_COSTS)."""
        with self._transaction() as conn:
            conn.execute(_RUN_COSTS)
            conn.execute(
                "INSERT INTO run_costs VALUES (?, ?, ?, ?, ?, ?, ?)",
                (run_id, platform, devices, tests, wall, bound, time.time()),
            )

    def fixed_cost(self, platform: str, devices: int, tests: int) -> tuple[float, int]:
        """The median of wall - bound over the latest runs on this platform and pool size of
        about as many tests (half to twice: a single-test run's start-up says little of a
        suite's), and how many runs it is of: (0.0, 0) when none was recorded."""
        try:
            rows = self._conn.execute(
                "SELECT wall - bound FROM run_costs WHERE platform = ? AND devices = ? "
                "AND tests * 2 >= ? AND tests <= ? * 2 ORDER BY time DESC LIMIT ?",
                (platform, devices, tests, tests, FIXED_WINDOW),
            ).fetchall()
        except sqlite3.OperationalError:
            return 0.0, 0  # no such table: an older devpool wrote this history
        costs = sorted(max(0.0, float(r[0])) for r in rows)
        if not costs:
            return 0.0, 0
        return statistics.median(costs), len(costs)

    def close(self) -> None:
        self._conn.close()


def write_export(out: Path, rows: Iterable[TestResult]) -> int:
    """Results as an export file (header line, then one JSON object a row); returns the rows.

    Written to a temporary name and renamed, so a reader never sees half a file.
    """
    rows = list(rows)
    header = {"format": EXPORT_FORMAT, "schema": HISTORY_SCHEMA, "rows": len(rows)}
    partial = out.with_name(f".{out.name}.{os.getpid()}.part")
    try:
        made(out.parent)
        with open(partial, "w", encoding="utf-8") as file:
            file.write(json.dumps(header) + "\n")
            for result in rows:
                file.write(json.dumps(asdict(result), ensure_ascii=False) + "\n")
        os.replace(partial, out)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise DevpoolError(f"cannot write history export {out}: {exc.strerror or exc}") from None
    return len(rows)


def write_pending(history_path: Path, run_id: str, results: Iterable[TestResult]) -> Path:
    """A shard run's results as a pending per-run file beside the history; returns its path."""
    path = pending_dir(history_path) / f"{run_id}.jsonl"
    write_export(path, results)
    return path


def _read_export(source: Path) -> Iterator[TestResult]:
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DevpoolError(f"cannot read {source} as a history export: {exc}") from None
    lines = text.splitlines()
    header = _json_object(lines[0]) if lines else None
    if header is None or header.get("format") != EXPORT_FORMAT:
        raise DevpoolError(
            f"{source} is not a devpool history export (its first line is no "
            f'{{"format": "{EXPORT_FORMAT}", ...}} header)'
        )
    schema = header.get("schema")
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
        raise DevpoolError(f"{source} is not a devpool history export (schema {schema!r})")
    if schema > HISTORY_SCHEMA:
        raise DevpoolError(
            f"{source} was written by a newer devpool (schema {schema}); "
            f"this one reads {HISTORY_SCHEMA}"
        )
    for number, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        result = _result(_json_object(line))
        if result is None:
            raise DevpoolError(
                f"{source} line {number} is not a devpool history row "
                f"(expected an object with {', '.join(_FIELDS)})"
            )
        yield result


def _json_object(line: str) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _result(row: dict[str, Any] | None) -> TestResult | None:
    if row is None:
        return None
    try:
        nodeid, outcome, platform, runner, run_id = (
            row["nodeid"],
            row["outcome"],
            row["platform"],
            row["runner_class"],
            row.get("run_id", ""),
        )
        duration, when, count = row["duration"], row["time"], row["device_count"]
        peak = row.get("memory_peak")  # absent in schema 1 exports
        load = row.get("cpu_load")  # absent before schema 3
    except KeyError:
        return None
    texts_ok = all(isinstance(v, str) for v in (nodeid, outcome, platform, runner, run_id))
    numbers_ok = all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in (duration, when)
    )
    count_ok = isinstance(count, int) and not isinstance(count, bool) and count >= 0
    peak_ok = peak is None or (isinstance(peak, int) and not isinstance(peak, bool) and peak >= 0)
    load_ok = load is None or (
        isinstance(load, (int, float)) and not isinstance(load, bool) and load >= 0
    )
    if not (texts_ok and numbers_ok and count_ok and peak_ok and load_ok) or duration < 0:
        return None
    return TestResult(
        nodeid,
        outcome,
        float(duration),
        platform,
        count,
        runner,
        float(when),
        run_id,
        peak,
        None if load is None else float(load),
    )
