"""Unit tests of what the `devpool` command reads without a pytest session: the project's
settings (project.py), `devpool run`'s pytest arguments and the platform capacity reports on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from devpool.capacity.cli import _spec_platform
from devpool.devices import inventory
from devpool.devices.inventory import load_platforms
from devpool.errors import DevpoolError
from devpool.project import find_pyproject, option_value, project_settings
from devpool.session.runner import pytest_arguments


def test_option_value_reads_both_spellings_and_stops_at_dashes() -> None:
    args = ["tests", "--devices", "sim:0-3", "--devpool-run-dir=out", "--", "--devices", "x"]
    assert option_value(args, "--devices") == "sim:0-3"
    assert option_value(args, "--devpool-run-dir") == "out"
    assert option_value(args, "--devpool-keep-runs") is None


def test_project_settings_from_the_nearest_pyproject_and_the_command_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.devpool]\nlock-dir = "/locks/a"\nkeep-runs = 3\ndevices = "sim:0-1"\n\n'
        '[tool.devpool.profiles.ci]\nlock-dir = "/locks/ci"\n'
    )
    below = tmp_path / "a" / "b"
    below.mkdir(parents=True)
    assert find_pyproject(below) == tmp_path / "pyproject.toml"
    settings = project_settings(below, ["--devpool-keep-runs", "5"], environ={})
    assert (settings.lock_dir, settings.keep_runs, settings.devices) == (
        Path("/locks/a"),
        5,
        "sim:0-1",
    )
    assert project_settings(below, [], environ={"CI": "true"}).lock_dir == Path("/locks/ci")
    assert project_settings(below, ["--devices", "sim:4"], environ={}).devices == "sim:4"
    with pytest.raises(DevpoolError, match="keep-runs must be a whole number"):
        project_settings(below, ["--devpool-keep-runs=0"], environ={})


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["--", "pytest", "tests", "-x"], ["tests", "-x"]),
        (["/usr/bin/pytest", "tests"], ["tests"]),
        (["--", "python3", "-m", "pytest", "-k", "a"], ["-k", "a"]),
        ([sys.executable, "-m", "pytest"], []),
        (["--", "tests", "-x"], ["tests", "-x"]),
        (["python", "script.py"], ["python", "script.py"]),
    ],
)
def test_devpool_run_drops_a_leading_pytest_command(given: list[str], expected: list[str]) -> None:
    assert pytest_arguments(given) == expected


def test_a_folder_named_pytest_is_a_test_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pytest").mkdir()
    monkeypatch.chdir(tmp_path)
    assert pytest_arguments(["pytest", "-x"]) == ["pytest", "-x"]


def test_the_platform_comes_from_the_devices_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    platforms = load_platforms({"a2a3": "ascend"})
    assert _spec_platform(None, platforms) == ("cuda", None)
    assert _spec_platform("a2a3:0-3,6", platforms) == ("a2a3", 5)
    assert _spec_platform("rocm", platforms) == ("rocm", None)
    found = {"ascend": [0, 1]}
    monkeypatch.setattr(inventory, "detect", lambda kind, timeout=10.0: found.get(kind))
    assert _spec_platform("auto", platforms) == ("ascend", 2)
    found.clear()
    with pytest.raises(DevpoolError, match="found no accelerator on this host.*--platform"):
        _spec_platform("0-3", platforms)
