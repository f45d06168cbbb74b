"""A worker's shared tables (select/tables.py): sent once, put back in every test's deps."""

from __future__ import annotations

from typing import Any

from devpool.select.tables import SentTables, expand


def deps(
    tables: SentTables, own: dict[str, str], shared: dict[str, str], libs: dict[str, Any]
) -> dict[str, Any]:
    return {
        "nodeid": "t",
        "recorded": True,
        "why": "",
        "blocks": own,
        **tables.refer("shared_blocks", shared),
        **tables.refer("libs", libs),
    }


def test_a_table_travels_once_and_comes_back_in_every_test() -> None:
    worker = SentTables()
    shared, libs = {"m.py::<module>": "a"}, {"/lib/x.so": [1, 2]}
    first = deps(worker, {"m.py::f": "b"}, shared, libs)
    second = deps(worker, {"m.py::g": "c"}, shared, libs)
    assert "shared_blocks" in first and "libs" in first
    assert "shared_blocks" not in second and "libs" not in second  # by digest only
    assert expand(first)["blocks"] == {"m.py::<module>": "a", "m.py::f": "b"}
    again = expand(second)
    assert again["blocks"] == {"m.py::<module>": "a", "m.py::g": "c"}
    assert again["libs"] == libs and again["recorded"] is True
    assert expand(again) == again  # idempotent: a Ray merge expands before the session


def test_a_replaced_table_gets_a_new_name_and_another_worker_sends_its_own() -> None:
    worker, other = SentTables(), SentTables()
    libs = {"/lib/x.so": [1, 2]}
    first = deps(worker, {}, {}, libs)
    grown = deps(worker, {}, {}, {**libs, "/lib/y.so": [3, 4]})
    assert grown["libs_id"] != first["libs_id"] and "libs" in grown
    elsewhere = deps(other, {}, {}, dict(libs))
    assert elsewhere["libs_id"] == first["libs_id"] and "libs" in elsewhere
    assert expand(grown)["libs"] == {"/lib/x.so": [1, 2], "/lib/y.so": [3, 4]}


def test_a_table_whose_content_never_arrived_leaves_the_test_unrecorded() -> None:
    lost = {"nodeid": "t", "recorded": True, "why": "", "blocks": {}, "libs_id": "f" * 24}
    full = expand(lost)
    assert full["recorded"] is False
    assert full["why"] == "its worker's libs table never arrived"
