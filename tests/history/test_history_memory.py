"""Peak device memory in the duration history: schema 2, the migration of schema 1 files,
export/merge of peaks, and the per-test peaks `devpool capacity --suggest-memory` reads."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from devpool.errors import DevpoolError
from devpool.history.durations import HISTORY_SCHEMA, History, TestResult
from devpool.history.location import merge

T0 = 1_700_000_000.0
GiB = 2**30

# The schema 1 table exactly as devpool wrote it before peaks were recorded.
_SCHEMA_1 = """
CREATE TABLE results (
    nodeid TEXT NOT NULL, outcome TEXT NOT NULL, duration REAL NOT NULL,
    platform TEXT NOT NULL, device_count INTEGER NOT NULL, runner_class TEXT NOT NULL,
    time REAL NOT NULL, run_id TEXT NOT NULL DEFAULT '', UNIQUE (nodeid, run_id, time)
);
CREATE INDEX results_by_test ON results (nodeid, time);
PRAGMA application_id = 1685090156;
PRAGMA user_version = 1;
"""


def old_history(path: Path, rows: int = 3) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(_SCHEMA_1)
    conn.executemany(
        "INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(f"t.py::t{i}", "passed", 1.0 + i, "sim", 1, "sim-8", T0 + i, "r1") for i in range(rows)],
    )
    conn.commit()
    conn.close()
    return path


def peak(nodeid: str, at: float, bytes_: int | None, outcome: str = "passed") -> TestResult:
    return TestResult(nodeid, outcome, 1.0, "sim", 1, "sim-8", at, f"r{at}", bytes_)


def test_schema_1_history_is_migrated_in_place_keeping_every_row(tmp_path: Path) -> None:
    path = old_history(tmp_path / "h.sqlite")
    with History(path) as history:
        rows = list(history.results())
        assert [(r.nodeid, r.duration, r.memory_peak) for r in rows] == [
            (f"t.py::t{i}", 1.0 + i, None) for i in range(3)
        ]
        assert history.estimate("t.py::t2") == 3.0
        history.add([peak("t.py::t0", T0 + 10, 3 * GiB)])
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == HISTORY_SCHEMA
    assert conn.execute("SELECT count(*) FROM results").fetchone()[0] == 4
    conn.close()
    with History(path) as again:  # a second open finds it current: nothing to do
        assert again.peaks() == {"t.py::t0": (1, 3 * GiB)}


def test_schema_1_history_file_merges_with_no_peaks(tmp_path: Path) -> None:
    source = old_history(tmp_path / "old.sqlite")
    with History(tmp_path / "new.sqlite") as history:
        assert merge(history, source) == 3
        assert {r.memory_peak for r in history.results()} == {None}
    conn = sqlite3.connect(source)  # read as a source, never rewritten
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.close()


def test_read_only_schema_1_copy_still_gives_estimates(tmp_path: Path) -> None:
    # (Run as root the file stays writable and is migrated: it reads alike either way.)
    path = old_history(tmp_path / "h.sqlite")
    path.chmod(0o444)
    try:
        with History(path) as history:
            assert history.estimate("t.py::t1") == 2.0
            assert [r.memory_peak for r in history.results()] == [None, None, None]
            assert history.peaks() == {}
    finally:
        path.chmod(0o644)


def test_export_and_merge_carry_peaks(tmp_path: Path) -> None:
    rows = [peak("t.py::a", T0, 5 * GiB), peak("t.py::b", T0, None)]
    out = tmp_path / "x.jsonl"
    with History(tmp_path / "a.sqlite") as a:
        a.add(rows)
        a.export(out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["schema"] == HISTORY_SCHEMA
    assert [line["memory_peak"] for line in lines[1:]] == [5 * GiB, None]
    with History(tmp_path / "b.sqlite") as b, History(tmp_path / "c.sqlite") as c:
        merge(b, out)
        merge(c, tmp_path / "a.sqlite")
        assert list(b.results()) == rows
        assert list(c.results()) == rows


def test_schema_1_export_merges_with_no_peaks(tmp_path: Path) -> None:
    export = tmp_path / "old.jsonl"
    row = {"nodeid": "t.py::a", "outcome": "passed", "duration": 2.0, "platform": "sim"}
    row |= {"device_count": 1, "runner_class": "sim-8", "time": T0, "run_id": "r"}
    header = {"format": "devpool-history", "schema": 1, "rows": 1}
    export.write_text(json.dumps(header) + "\n" + json.dumps(row) + "\n")
    with History(tmp_path / "h.sqlite") as history:
        assert merge(history, export) == 1
        assert [r.memory_peak for r in history.results()] == [None]


@pytest.mark.parametrize("bad", [-1, "3GiB", 1.5, True])
def test_export_row_with_a_bad_peak_is_one_sentence(tmp_path: Path, bad: object) -> None:
    export = tmp_path / "bad.jsonl"
    row = {"nodeid": "t.py::a", "outcome": "passed", "duration": 2.0, "platform": "sim"}
    row |= {"device_count": 1, "runner_class": "sim-8", "time": T0, "memory_peak": bad}
    header = {"format": "devpool-history", "schema": HISTORY_SCHEMA, "rows": 1}
    export.write_text(json.dumps(header) + "\n" + json.dumps(row) + "\n")
    with History(tmp_path / "h.sqlite") as history, pytest.raises(DevpoolError, match="line 2"):
        merge(history, export)


def test_peaks_are_the_highest_of_each_tests_last_window_watched_results(tmp_path: Path) -> None:
    with History(tmp_path / "h.sqlite") as history:
        history.add(
            [
                peak("t.py::a", T0, 9 * GiB),  # old: leaves the window of 2
                peak("t.py::a", T0 + 1, 2 * GiB),
                peak("t.py::a", T0 + 2, None),  # not watched: not counted
                peak("t.py::a", T0 + 3, 3 * GiB, outcome="failed"),  # an overrun counts
                peak("t.py::b", T0, None),
            ]
        )
        assert history.peaks(window=2) == {"t.py::a": (2, 3 * GiB)}
        assert history.peaks() == {"t.py::a": (3, 9 * GiB)}
