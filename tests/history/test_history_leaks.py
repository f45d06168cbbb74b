"""What tests left behind, in the duration history (schema 4, issue 52): each result's leaks,
a schema 3 file migrated in place, export and merge, and the tests view's flaky table naming a
test that leaked in several runs. PostgreSQL: tests/history/test_history_pg.py."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from history_rows import T0, result

from devpool.history.durations import HISTORY_SCHEMA, History
from devpool.history.location import merge
from devpool.serve import pages, views


def schema_3(path: Path) -> Path:
    """A history as devpool wrote it before leaks were kept (schema 3), with two rows."""
    with History(path) as history:
        history.add([result("t::a", 1.0, T0, "r1"), result("t::b", 2.0, T0 + 1, "r1")])
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE results DROP COLUMN leaks")
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()
    return path


def test_a_schema_3_history_is_migrated_and_keeps_leaks_from_then_on(tmp_path: Path) -> None:
    path = schema_3(tmp_path / "h.sqlite")
    with History(path, read_only=True) as copy:  # read as it is: no leaks known
        assert [r.leaks for r in copy.results()] == [None, None]
    with History(path) as history:
        history.add([result("t::a", 1.0, T0 + 10, "r2", leaks=2)])
        assert [(r.nodeid, r.leaks) for r in history.results()] == [
            ("t::a", None),
            ("t::b", None),
            ("t::a", 2),
        ]
        assert history.estimate("t::a") == 1.0
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == HISTORY_SCHEMA
    conn.close()


def test_export_and_merge_carry_leaks(tmp_path: Path) -> None:
    rows = [result("t::a", 1.0, T0, "r1", leaks=1), result("t::b", 1.0, T0, "r1", leaks=None)]
    with History(tmp_path / "a.sqlite") as source:
        source.add(rows)
        source.export(tmp_path / "out.jsonl")
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert json.loads(lines[1])["leaks"] == 1
    with History(tmp_path / "b.sqlite") as target:
        merge(target, tmp_path / "out.jsonl")
        assert [r.leaks for r in target.results()] == [1, None]


def test_a_test_that_leaked_in_several_runs_is_named_in_the_flaky_table(tmp_path: Path) -> None:
    """Passing every time, it still left something on its devices in two runs: named, with
    the runs it leaked in; one leak alone is no pattern."""
    folder = tmp_path / ".devpool"
    folder.mkdir()
    rows = []
    for run in range(4):
        rows.append(result("t::leaks", 1.0, T0 + run, f"r{run}", leaks=1 if run in (1, 3) else 0))
        rows.append(result("t::once", 1.0, T0 + run, f"r{run}", leaks=1 if run == 2 else 0))
        rows.append(result("t::steady", 1.0, T0 + run, f"r{run}"))
    with History(folder / "history.sqlite") as history:
        history.add(rows)
    view = views.tests_view(views.projects_of([folder]))
    flaky = view["projects"][0]["flaky"]
    assert [(row["test"], row["leaked"], row["flaky"], row["failed"]) for row in flaky] == [
        ("t::leaks", 2, 0, 0)
    ]
    table = pages.tests_section(view).replace("<wbr>", "")
    assert "<th>leaked</th>" in table and "t::leaks" in table and "t::once" not in table
