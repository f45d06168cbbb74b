"""Unit tests for devpool.worklist: a worker's arguments and the controller's selection."""

from __future__ import annotations

from pathlib import Path

from devpool.worklist import glue_option_values, read_selection, write_selection

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


def test_the_selection_round_trips_through_its_file(tmp_path: Path) -> None:
    ids = ["test_a.py::test_x", "test_a.py::test_y[1-2]", "sub/test_b.py::TestC::test_z"]

    path = write_selection(ids, tmp_path / "collect")

    assert path.parent == tmp_path / "collect"
    assert read_selection(path) == set(ids)
