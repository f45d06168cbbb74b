"""Unit tests for devpool.worker.worklist: a worker's arguments and the controller's selection."""

from __future__ import annotations

from pathlib import Path

import pytest

from devpool.worker.worklist import (
    Worklist,
    glue_option_values,
    read_selection,
    write_selection,
)

VALUE_OPTIONS = {"--devpool-lock-dir", "--devices", "--cov"}


def test_option_values_are_glued_so_no_value_reads_as_a_test_path() -> None:
    args = ["tests", "--devpool-lock-dir", "/new/folder", "--devices", "sim:0-3", "-x"]

    assert glue_option_values(args, VALUE_OPTIONS) == [
        "tests",
        "--devpool-lock-dir=/new/folder",
        "--devices=sim:0-3",
        "-x",
    ]


def test_glued_forms_flags_and_unknown_options_stay_as_they_are() -> None:
    args = ["--devices=sim:0", "--verbose", "tests", "--other", "value", "--cov"]

    assert glue_option_values(args, VALUE_OPTIONS) == args


def test_a_value_that_looks_like_an_option_is_left_alone() -> None:
    # argparse may read "-1" as a value or as an option: leaving it alone keeps its reading.
    args = ["--devices", "-1", "tests"]

    assert glue_option_values(args, VALUE_OPTIONS) == args


def test_nothing_after_a_double_dash_is_touched() -> None:
    args = ["--devices", "sim:0", "--", "--devpool-lock-dir", "odd-file-name"]

    assert glue_option_values(args, VALUE_OPTIONS) == [
        "--devices=sim:0",
        "--",
        "--devpool-lock-dir",
        "odd-file-name",
    ]


def test_the_selection_round_trips_through_its_file(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_a="""
        import pytest

        def test_x():
            pass

        @pytest.mark.parametrize("a, b", [(1, 2), (3, 4)])
        def test_y(a, b):
            pass

        class TestC:
            @pytest.mark.parametrize("c", ["\\t"])
            def test_z(self, c):
                pass
        """
    )
    items, _ = pytester.inline_genitems()

    path = write_selection(items, pytester.path / "collect")
    selection = read_selection(path)

    assert path.parent == pytester.path / "collect"
    assert selection.nodeids == {item.nodeid for item in items}
    assert selection.place_of("test_a.py::test_y[3-4]") == "test_a.py::test_y[a=1,b=1]"
    assert selection.place_of("test_a.py::TestC::test_z[\\t]") == "test_a.py::TestC::test_z[c=0]"
    assert selection.place_of("test_a.py::test_x") is None


def test_a_worklist_collects_only_its_modules_and_never_skips_a_conftest(tmp_path: Path) -> None:
    modules = tmp_path / "modules.txt"
    modules.write_text(f"{tmp_path / 'test_mine.py'}\n", encoding="utf-8")
    worklist = Worklist(str(modules), None)

    assert worklist.ignores(tmp_path / "test_mine.py") is None
    assert worklist.ignores(tmp_path / "test_other.py") is True
    assert worklist.ignores(tmp_path / "conftest.py") is None
    assert Worklist(None, None).ignores(tmp_path / "test_other.py") is None


def test_a_worklist_without_the_controllers_file_keeps_its_own_collection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    worklist = Worklist(None, str(tmp_path / "missing.txt"))

    assert worklist.selected is None
    assert "runs without the controller's selection" in capsys.readouterr().err
