"""Unit tests of the duration history (history.py): estimates, drift, export/merge, bad files."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
from history_rows import T0, result

from devpool.errors import DevpoolError
from devpool.history.durations import (
    HISTORY_SCHEMA,
    History,
    default_history_path,
    p90,
    pending_dir,
    pending_files,
    runner_class,
    write_pending,
)
from devpool.history.location import merge


@pytest.fixture
def history(tmp_path: Path) -> History:
    h = History(default_history_path(tmp_path))
    yield h  # type: ignore[misc]
    h.close()


def test_default_path_is_under_dot_devpool(tmp_path: Path) -> None:
    assert default_history_path(tmp_path) == tmp_path / ".devpool" / "history.sqlite"


def test_runner_class_from_environment_or_platform_and_pool() -> None:
    assert runner_class("cuda", 8, {}) == "cuda-8"
    assert runner_class("cuda", 8, {"DEVPOOL_RUNNER_CLASS": "a100-big"}) == "a100-big"


def test_p90_is_nearest_rank() -> None:
    assert p90([]) is None
    assert p90([3.0]) == 3.0
    assert p90([float(d) for d in range(1, 11)]) == 9.0
    assert p90([1.0, 1.0, 1.0, 10.0]) == 10.0


def test_estimate_is_p90_of_counted_outcomes(history: History) -> None:
    history.add(result("t.py::a", float(d), T0 + d, f"r{d}") for d in range(1, 11))
    # Skips and timeouts say nothing about how long a test takes.
    history.add([result("t.py::a", 500.0, T0 + 50, "r50", outcome="skipped")])
    history.add([result("t.py::a", 900.0, T0 + 60, "r60", outcome="timeout")])
    assert history.estimate("t.py::a") == 9.0
    assert history.estimate("t.py::missing") is None
    history.add([result("t.py::b", 5.0, T0, "r1", outcome="skipped")])
    assert history.estimate("t.py::b") is None


def test_flaky_and_failed_count(history: History) -> None:
    history.add(
        [
            result("t.py::a", 2.0, T0, "r1", outcome="failed"),
            result("t.py::a", 4.0, T0 + 1, "r2", outcome="flaky"),
        ]
    )
    assert history.estimate("t.py::a") == 4.0


def test_window_keeps_only_recent_runs(history: History) -> None:
    old = [result("t.py::a", 100.0, T0 + i, f"old{i}") for i in range(10)]
    new = [result("t.py::a", 1.0, T0 + 100 + i, f"new{i}") for i in range(20)]
    history.add(old + new)
    assert history.estimate("t.py::a", window=20) == 1.0
    assert history.estimate("t.py::a", window=30) == 100.0


def test_estimates_matches_estimate_for_every_test(history: History) -> None:
    history.add(
        result(f"t.py::t{i}", float(i % 7 + r), T0 + r, f"r{r}")
        for i in range(50)
        for r in range(5)
    )
    all_at_once = history.estimates(window=3)
    assert len(all_at_once) == 50
    for nodeid, value in all_at_once.items():
        assert value == history.estimate(nodeid, window=3)


def test_previous_leaves_out_the_latest_run(history: History) -> None:
    history.add([result("t.py::a", 1.0, T0 + i, f"r{i}") for i in range(3)])
    # The latest run ran the test twice (repeat): both rows belong to it.
    history.add([result("t.py::a", 10.0, T0 + 10, "r9"), result("t.py::a", 12.0, T0 + 11, "r9")])
    assert history.estimate("t.py::a") == 12.0
    assert history.previous("t.py::a") == 1.0
    assert history.previous_estimates() == {"t.py::a": 1.0}


def test_previous_without_run_ids_leaves_out_the_newest_row(history: History) -> None:
    history.add([result("t.py::a", 2.0, T0), result("t.py::a", 8.0, T0 + 1)])
    assert history.previous("t.py::a") == 2.0
    history.add([result("t.py::b", 3.0, T0)])
    assert history.previous("t.py::b") is None
    assert "t.py::b" not in history.previous_estimates()


def test_same_result_is_kept_once(history: History) -> None:
    row = result("t.py::a", 1.0, T0, "r1")
    history.add([row])
    history.add([row])
    assert list(history.results()) == [row]


def test_export_merge_round_trip(tmp_path: Path, history: History) -> None:
    rows = [result(f"t.py::t{i}", 0.5 + i, T0 + i, "r1", device_count=i % 3) for i in range(6)]
    history.add(rows)
    out = tmp_path / "export.jsonl"
    assert history.export(out) == 6
    header = json.loads(out.read_text().splitlines()[0])
    assert header == {"format": "devpool-history", "schema": HISTORY_SCHEMA, "rows": 6}

    with History(tmp_path / "other.sqlite") as other:
        other.add([result("t.py::t0", 0.5, T0, "r1"), result("t.py::new", 3.0, T0, "r0")])
        assert merge(other, out) == 5  # t0 of r1 at T0 is already there
        assert merge(other, out) == 0  # de-duplicated by (nodeid, run_id, time)
        assert {r.nodeid for r in other.results()} == {f"t.py::t{i}" for i in range(6)} | {
            "t.py::new"
        }
        assert other.estimates()["t.py::t4"] == history.estimates()["t.py::t4"]
        got = {r.nodeid: r for r in other.results()}
        assert got["t.py::t5"] == rows[5]


def test_merge_reads_another_history_file(tmp_path: Path, history: History) -> None:
    with History(tmp_path / "runner2.sqlite") as runner2:
        runner2.add([result("t.py::a", 7.0, T0, "x"), result("t.py::b", 2.0, T0, "x")])
    assert merge(history, tmp_path / "runner2.sqlite") == 2
    assert history.estimate("t.py::a") == 7.0


def test_corrupt_file_is_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    path.write_bytes(b"this is not a database, it is a shopping list\n" * 100)
    with pytest.raises(DevpoolError, match=r"is not a devpool history \(file is not a database\)"):
        History(path)


def test_another_programs_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE results (x)")
    conn.commit()
    conn.close()
    with pytest.raises(DevpoolError, match="is not a devpool history .it is another program"):
        History(path)


def test_newer_schema_is_refused_not_misread(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    History(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {HISTORY_SCHEMA + 1}")
    conn.close()
    with pytest.raises(DevpoolError) as info:
        History(path)
    newer = f"written by a newer devpool (schema {HISTORY_SCHEMA + 1}); this one reads "
    assert newer + str(HISTORY_SCHEMA) in str(info.value)


def test_newer_export_is_refused(tmp_path: Path, history: History) -> None:
    export = tmp_path / "new.jsonl"
    newer = {"format": "devpool-history", "schema": HISTORY_SCHEMA + 1, "rows": 0}
    export.write_text(json.dumps(newer) + "\n")
    with pytest.raises(
        DevpoolError, match=rf"schema {HISTORY_SCHEMA + 1}\); this one reads {HISTORY_SCHEMA}"
    ):
        merge(history, export)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hello\n", "is not a devpool history export"),
        ('{"format": "devpool-history", "schema": 1}\n{"nodeid": 3}\n', "line 2 is not a devpool"),
        ('{"format": "devpool-history", "schema": 1}\nnot json\n', "line 2 is not a devpool"),
    ],
)
def test_bad_export_is_one_sentence(
    tmp_path: Path, history: History, text: str, message: str
) -> None:
    export = tmp_path / "bad.jsonl"
    export.write_text(text)
    with pytest.raises(DevpoolError, match=message):
        merge(history, export)
    assert list(history.results()) == []  # nothing half-merged


def test_missing_merge_source_is_one_sentence(tmp_path: Path, history: History) -> None:
    with pytest.raises(DevpoolError, match="cannot read .*nope.jsonl"):
        merge(history, tmp_path / "nope.jsonl")


def test_estimates_for_ten_thousand_tests_is_fast(history: History) -> None:
    history.add(
        result(f"tests/test_m{i // 100}.py::test_{i}", 0.01 * (i % 50) + r, T0 + r, f"r{r}")
        for i in range(10_000)
        for r in range(3)
    )
    start = time.perf_counter()
    estimates = history.estimates()
    elapsed = time.perf_counter() - start
    assert len(estimates) == 10_000
    assert estimates["tests/test_m0.py::test_7"] == pytest.approx(2.07)
    assert elapsed < 5.0, f"estimates() took {elapsed:.2f} s for 10,000 tests"


def test_pending_files_are_not_estimates_until_merged(tmp_path: Path, history: History) -> None:
    history.add([result("t::a", 2.0, T0, "r1")])
    written = write_pending(history.path, "20261201-120000-1", [result("t::a", 9.0, T0 + 1, "r2")])
    assert written.parent == pending_dir(history.path) == tmp_path / ".devpool" / "history.d"
    assert pending_files(history.path) == [written]
    assert history.estimates() == {"t::a": 2.0}  # a shard's own run changes no estimate
    assert history.merge_pending() == (1, [written])
    assert history.estimate("t::a") == 9.0
    assert pending_files(history.path) == []
    assert history.merge_pending() == (0, [])


def test_a_pending_file_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    target = tmp_path / "history.d" / "run.jsonl"
    write_pending(tmp_path / "history.sqlite", "run", [result("t::a", 1.0, T0)])
    assert [p.name for p in target.parent.iterdir()] == ["run.jsonl"]  # no partial file left
    lines = target.read_text().splitlines()
    assert json.loads(lines[0])["rows"] == 1 and len(lines) == 2


def test_recent_outcomes_counts_newer_results_first(history: History) -> None:
    history.add([result("t::a", 1.0, T0 + i, f"r{i}", outcome="passed") for i in range(3)])
    newer = [result("t::a", 1.0, T0 + 9, "r9", outcome="failed"), result("t::b", 1.0, T0, "x")]
    assert history.recent_outcomes("t::a", 3, newer) == ["failed", "passed", "passed"]
    assert history.recent_outcomes("t::a", 3) == ["passed"] * 3


def test_fixed_cost_is_the_median_over_recent_runs_of_about_the_same_size(
    history: History,
) -> None:
    assert history.fixed_cost("sim", 8, 100) == (0.0, 0)  # none recorded yet
    for k, (tests, wall) in enumerate([(100, 13.0), (90, 14.0), (120, 12.5), (1, 2.0)]):
        history.add_run_cost(f"r{k}", "sim", 8, tests, wall, 10.0)
    history.add_run_cost("other", "sim", 4, 100, 50.0, 10.0)  # another pool size
    # Runs of 1 test say little of a suite of 100; the 4-device pool is another runner.
    assert history.fixed_cost("sim", 8, 100) == (3.0, 3)
    assert history.fixed_cost("sim", 8, 1) == (0.0, 1)  # a wall below the bound counts 0
    assert history.fixed_cost("cuda", 8, 100) == (0.0, 0)


def test_a_history_without_run_costs_has_no_fixed_cost(tmp_path: Path) -> None:
    """An older devpool's history has no run_costs table: no fixed cost, no error."""
    path = tmp_path / "h.sqlite"
    with History(path) as history:
        assert history.fixed_cost("sim", 8, 10) == (0.0, 0)
