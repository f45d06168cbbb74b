"""A recording across jobs (select/fleet.py): entries packed in batches and read back."""

from __future__ import annotations

from pathlib import Path

from devpool.select.baseline import Builder
from devpool.select.fleet import database_of, entry_of, pack_part, unpack_parts


def recorded(nodeid: str, block: str, lib: str) -> dict[str, object]:
    return {
        "nodeid": nodeid,
        "recorded": True,
        "why": "",
        "blocks": {"m.py::f": block, "m.py::<module>": "top"},
        "files": {"data.txt": "d1"},
        "libs": {lib: (10, 1)},
        "globs": [],
    }


def test_batches_read_back_as_one_builder_would_write_them(tmp_path: Path) -> None:
    inside = str(tmp_path / "build" / "libk.so")
    alone = Builder(tmp_path)
    alone.add(recorded("t::a", "h1", inside), "passed", 0)
    alone.add(recorded("t::b", "h2", "/usr/lib/libx.so"), "failed", 1)
    alone.add({"nodeid": "t::c", "recorded": False, "why": "a doctest"}, "passed", 0)
    hashes = {inside: "hk", "/usr/lib/libx.so": "hx"}
    expected = alone.database(hashes)
    entries = {n: entry_of(tmp_path, t, hashes) for n, t in alone.tests.items()}
    # sent in two batches by two jobs at another checkout path: named alike
    bodies = [pack_part(tmp_path, {"t::a": entries["t::a"]}), pack_part(Path("/elsewhere"), {
        k: entries[k] for k in ("t::b", "t::c")})]  # fmt: skip
    back, marks = unpack_parts(bodies)
    assert marks == {} and database_of(tmp_path, back) == expected
    assert expected["libs"][0][0] == "build/libk.so"  # relative to the rootdir


def test_a_test_sent_twice_keeps_its_last_entry(tmp_path: Path) -> None:
    builder = Builder(tmp_path)
    builder.add(recorded("t::a", "old", "/usr/lib/libx.so"), "failed", 0)
    first = entry_of(tmp_path, builder.tests["t::a"], {})
    again = Builder(tmp_path)  # its rerun, recorded by another job
    again.add(recorded("t::a", "new", "/usr/lib/libx.so"), "passed", 0)
    second = entry_of(tmp_path, again.tests["t::a"], {})
    back, _ = unpack_parts(
        [pack_part(tmp_path, {"t::a": first}), pack_part(tmp_path, {"t::a": second})]
    )
    assert list(back) == ["t::a"] and back["t::a"]["outcome"] == "passed"
    assert back["t::a"]["blocks"]["m.py::f"] == "new"
