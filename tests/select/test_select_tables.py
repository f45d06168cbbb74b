"""A worker's shared tables (select/tables.py): sent once, put back in every test's deps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devpool.select.baseline import Builder
from devpool.select.tables import SentTables, expand


def deps(
    tables: SentTables, own: list[list[Any]], shared: list[list[Any]], libs: dict[str, Any]
) -> dict[str, Any]:
    return {
        "nodeid": "t",
        "recorded": True,
        "why": "",
        "spots": own,
        **tables.refer("shared_spots", shared),
        **tables.refer("libs", libs),
    }


def test_a_table_travels_once_and_comes_back_in_every_test() -> None:
    worker = SentTables()
    shared, libs = [["m.py", 0]], {"/lib/x.so": [1, 2]}
    first = deps(worker, [["m.py", 3]], shared, libs)
    second = deps(worker, [["m.py", 7]], shared, libs)
    assert "shared_spots" in first and "libs" in first
    assert "shared_spots" not in second and "libs" not in second  # by digest only
    assert expand(first)["spots"] == [["m.py", 0], ["m.py", 3]]
    again = expand(second)
    assert again["spots"] == [["m.py", 0], ["m.py", 7]]
    assert again["libs"] == libs and again["recorded"] is True
    assert expand(again) == again  # idempotent: a Ray merge expands before the session


def test_the_controller_turns_spots_into_the_blocks_of_its_files(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("X = 1\n\n\ndef f():\n    return X\n")
    builder = Builder(tmp_path)
    builder.add(
        {
            "nodeid": "t",
            "recorded": True,
            "why": "",
            "spots": [["m.py", 0], ["m.py", 4]],
            "files": {},
            "libs": {},
            "globs": [],
        },
        "passed",
        0,
    )
    assert set(builder.tests["t"]["blocks"]) == {"m.py::<module>", "m.py::f"}
    assert "spots" not in builder.tests["t"]
    # A file gone by the time the controller reads it gives no block (nor an error).
    builder.add(
        {
            "nodeid": "u",
            "recorded": True,
            "why": "",
            "spots": [["gone.py", 0]],
            "files": {},
            "libs": {},
            "globs": [],
        },
        "passed",
        0,
    )
    assert builder.tests["u"]["blocks"] == {}


def test_a_replaced_table_gets_a_new_name_and_another_worker_sends_its_own() -> None:
    worker, other = SentTables(), SentTables()
    libs = {"/lib/x.so": [1, 2]}
    first = deps(worker, [], [], libs)
    grown = deps(worker, [], [], {**libs, "/lib/y.so": [3, 4]})
    assert grown["libs_id"] != first["libs_id"] and "libs" in grown
    elsewhere = deps(other, [], [], dict(libs))
    assert elsewhere["libs_id"] == first["libs_id"] and "libs" in elsewhere
    assert expand(grown)["libs"] == {"/lib/x.so": [1, 2], "/lib/y.so": [3, 4]}


def test_a_table_whose_content_never_arrived_leaves_the_test_unrecorded() -> None:
    lost = {"nodeid": "t", "recorded": True, "why": "", "blocks": {}, "libs_id": "f" * 24}
    full = expand(lost)
    assert full["recorded"] is False
    assert full["why"] == "its worker's libs table never arrived"
