"""The header names where `devices` came from (the command line or pyproject.toml), and
says which profile applies and why, so a CI run's reruns do not appear from nowhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from sessions import run

PYPROJECT = """
[tool.devpool]
devices = "sim:0-3"

[tool.devpool.profiles.ci]
reruns = 1
"""


@pytest.fixture(autouse=True)
def _project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.delenv("CI", raising=False)
    pytester.makefile(".toml", pyproject=PYPROJECT)
    pytester.makepyfile(test_one="def test_one():\n    pass\n")


def header(result: pytest.RunResult) -> list[str]:
    lines = result.outlines
    return [line for line in lines[: lines.index(next(x for x in lines if "collected" in x))]]


def test_the_header_names_pyproject_as_the_source_of_devices(
    pytester: pytest.Pytester, lock: Path
) -> None:
    result = run(pytester, lock)

    first = next(line for line in header(result) if line.startswith("devpool: sim:0-3"))
    assert "pyproject.toml: [tool.devpool] devices = sim:0-3" in first, first
    assert "--devices" not in first
    assert not [line for line in header(result) if line.startswith("devpool: profile")]

    given = run(pytester, lock, "--devices=sim:0-1")
    first = next(line for line in header(given) if line.startswith("devpool: sim:0,1"))
    assert "from --devices sim:0-1;" in first, first


def test_the_header_says_the_ci_profile_applies_under_ci(
    pytester: pytest.Pytester, lock: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")

    result = run(pytester, lock)

    said = [line for line in header(result) if line.startswith("devpool: profile")]
    assert said == ["devpool: profile 'ci' applies (CI=true): reruns = 1"], header(result)
