"""Quarantine entries: which tests they cover, and one clear sentence for each bad entry."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from devpool.errors import DevpoolError
from devpool.history.quarantine import (
    Entry,
    Quarantine,
    entries_from_file,
    entries_from_table,
    expired,
)

TODAY = dt.date(2026, 6, 15)


def entry(key: str, **fields: object) -> Entry:
    return Entry(key, "flaky on shared hosts", **fields)  # type: ignore[arg-type]


# ---- Entry.covers ---------------------------------------------------------------------------


def test_exact_node_id() -> None:
    e = entry("tests/x.py::test_a")
    assert e.covers("tests/x.py::test_a", "sim", "sim")
    assert not e.covers("tests/x.py::test_ab", "sim", "sim")
    assert not e.covers("tests/x.py::test_", "sim", "sim")
    assert not e.covers("tests/y.py::test_a", "sim", "sim")
    assert not e.covers("other/tests/x.py::test_a", "sim", "sim")


def test_plain_id_covers_every_parameter() -> None:
    e = entry("tests/x.py::test_a")
    assert e.covers("tests/x.py::test_a[1]", "sim", "sim")
    assert e.covers("tests/x.py::test_a[cuda-fp16]", "sim", "sim")
    assert e.covers("tests/x.py::test_a[a::b]", "sim", "sim")
    assert not e.covers("tests/x.py::test_ab[1]", "sim", "sim")


def test_parametrized_id_covers_only_that_parameter() -> None:
    e = entry("tests/x.py::test_a[1]")
    assert e.covers("tests/x.py::test_a[1]", "sim", "sim")
    assert not e.covers("tests/x.py::test_a[2]", "sim", "sim")
    assert not e.covers("tests/x.py::test_a[10]", "sim", "sim")
    assert not e.covers("tests/x.py::test_a", "sim", "sim")


def test_module_prefix() -> None:
    e = entry("tests/x.py")
    assert e.covers("tests/x.py::test_a", "sim", "sim")
    assert e.covers("tests/x.py::test_a[3]", "sim", "sim")
    assert e.covers("tests/x.py::TestA::test_b", "sim", "sim")
    assert not e.covers("tests/x.pyx::test_a", "sim", "sim")
    assert not e.covers("tests/x_py.py::test_a", "sim", "sim")
    assert not e.covers("tests/xx.py::test_a", "sim", "sim")


def test_class_prefix() -> None:
    e = entry("tests/x.py::TestA")
    assert e.covers("tests/x.py::TestA::test_b", "sim", "sim")
    assert e.covers("tests/x.py::TestA::test_b[p]", "sim", "sim")
    assert e.covers("tests/x.py::TestA::Inner::test_c", "sim", "sim")
    assert not e.covers("tests/x.py::TestAB::test_b", "sim", "sim")
    assert not e.covers("tests/x.py::test_a", "sim", "sim")


def test_platform_scope() -> None:
    e = entry("tests/x.py::test_a", platforms=("cuda", "a2a3"))
    assert e.covers("tests/x.py::test_a", "cuda", "cuda")
    assert e.covers("tests/x.py::test_a", "a2a3", "ascend")
    assert not e.covers("tests/x.py::test_a", "sim", "sim")
    # A project platform matches by its kind too.
    by_kind = entry("tests/x.py::test_a", platforms=("sim",))
    assert by_kind.covers("tests/x.py::test_a", "a2a3sim", "sim")
    assert not by_kind.covers("tests/x.py::test_a", "a2a3", "ascend")
    unscoped = entry("tests/x.py::test_a")
    assert unscoped.covers("tests/x.py::test_a", "rocm", "rocm")


def test_unmatched_leaves_out_entries_scoped_elsewhere() -> None:
    here = entry("tests/x.py::test_gone")
    elsewhere = entry("tests/x.py::test_cuda_only", platforms=("cuda",))
    book = Quarantine([here, elsewhere], "sim", "sim")
    assert book.unmatched() == [here]


# ---- expiry ---------------------------------------------------------------------------------


def test_expired() -> None:
    old = entry("a", until=dt.date(2026, 6, 14))
    today = entry("b", until=TODAY)
    later = entry("c", until=dt.date(2027, 1, 1))
    forever = entry("d")
    assert old.expired(TODAY)
    assert not today.expired(TODAY)  # until is the last day it holds
    assert not later.expired(TODAY)
    assert not forever.expired(TODAY)
    assert expired([old, today, later, forever], TODAY) == [old]


def test_describe() -> None:
    e = Entry("k", "races the allocator", "ana", dt.date(2026, 12, 31))
    assert e.describe() == "races the allocator; owner ana; until 2026-12-31"
    assert entry("k").describe() == "flaky on shared hosts"


# ---- entries from a table -------------------------------------------------------------------


def test_entries_from_table() -> None:
    table = {
        "tests/x.py::test_a": {
            "reason": "NCCL hang",
            "owner": "ana",
            "until": "2026-12-31",
            "platforms": ["cuda"],
        },
        "tests/y.py": {"reason": "whole module", "until": dt.date(2027, 1, 2)},
    }
    a, y = entries_from_table(table, "pyproject.toml")
    assert a == Entry(
        "tests/x.py::test_a",
        "NCCL hang",
        "ana",
        dt.date(2026, 12, 31),
        ("cuda",),
        "pyproject.toml: quarantine entry 'tests/x.py::test_a'",
    )
    assert y.until == dt.date(2027, 1, 2) and y.owner == "" and y.platforms is None


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"reason": "r", "until": "2026-13-01"}, "until='2026-13-01' is not a date"),
        ({"reason": "r", "until": "next week"}, "until='next week' is not a date"),
        ({"reason": "r", "until": 2026}, "until=2026 is not a date"),
        ({"reason": "r", "ownr": "ana"}, "unknown key 'ownr'"),
        ({"owner": "ana"}, 'needs reason = "'),
        ({"reason": "   "}, 'needs reason = "'),
        ({"reason": 3}, 'needs reason = "'),
        ({"reason": "r", "owner": 7}, "owner must be a string"),
        ({"reason": "r", "platforms": "cuda"}, "platforms must be a list"),
        ({"reason": "r", "platforms": ["cuda", 1]}, "platforms must be a list"),
    ],
)
def test_bad_entry_is_one_sentence(fields: dict[str, object], words: str) -> None:
    with pytest.raises(DevpoolError) as info:
        entries_from_table({"tests/x.py::test_a": fields}, "pyproject.toml")
    text = str(info.value)
    assert text.startswith("pyproject.toml: quarantine entry 'tests/x.py::test_a'")
    assert words in text
    assert "\n" not in text


def test_unknown_key_lists_the_known_ones() -> None:
    with pytest.raises(DevpoolError) as info:
        entries_from_table({"t.py::a": {"reason": "r", "ownr": "x"}}, "q.toml")
    assert "owner, platforms, reason, until" in str(info.value)


def test_entry_that_is_not_a_table() -> None:
    with pytest.raises(DevpoolError, match=r"entry 'tests/x.py::test_a' must be a table"):
        entries_from_table({"tests/x.py::test_a": "flaky"}, "pyproject.toml")


# ---- entries from a file --------------------------------------------------------------------


def test_file_with_top_level_tables(tmp_path: Path) -> None:
    path = tmp_path / "quarantine.toml"
    path.write_text(
        '["tests/x.py::test_a"]\nreason = "flaky"\nowner = "ana"\nuntil = 2026-12-31\n'
        '["tests/x.py::TestB"]\nreason = "slow device"\n'
    )
    a, b = entries_from_file(path)
    assert (a.key, a.owner, a.until) == ("tests/x.py::test_a", "ana", dt.date(2026, 12, 31))
    assert (b.key, b.reason) == ("tests/x.py::TestB", "slow device")
    assert a.source == f"{path}: quarantine entry 'tests/x.py::test_a'"


def test_file_with_a_quarantine_section(tmp_path: Path) -> None:
    path = tmp_path / "quarantine.toml"
    path.write_text('[quarantine."tests/x.py::test_a"]\nreason = "flaky"\nplatforms = ["sim"]\n')
    (a,) = entries_from_file(path)
    assert (a.key, a.platforms) == ("tests/x.py::test_a", ("sim",))


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(DevpoolError) as info:
        entries_from_file(path)
    assert str(info.value).startswith(f"cannot read quarantine file {path}")


def test_file_that_is_not_toml(tmp_path: Path) -> None:
    path = tmp_path / "quarantine.toml"
    path.write_text('["tests/x.py::test_a"\nreason = \n')
    with pytest.raises(DevpoolError, match="is not valid TOML"):
        entries_from_file(path)


def test_file_with_a_bad_entry_names_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "quarantine.toml"
    path.write_text('["tests/x.py::test_a"]\nreason = "flaky"\nuntil = "2026-13-01"\n')
    with pytest.raises(DevpoolError) as info:
        entries_from_file(path)
    text = str(info.value)
    assert str(path) in text and "'tests/x.py::test_a'" in text and "2026-13-01" in text
