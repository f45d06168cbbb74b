"""--setup-show, --setup-only and --setup-plan print what plain pytest prints, per test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sessions import IN_ORDER

SUITE = """
import pytest

@pytest.fixture(scope="session")
def base():
    yield 1

@pytest.fixture(scope="module")
def shared(base):
    yield base

@pytest.fixture
def value(shared):
    return shared + 1

def test_first(value):
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_params(shared, n):
    pass

def test_plain():
    pass
"""

# pytest's terminal puts a test's result letter (and the percentage) after its line.
_AFTER_TEST_LINE = re.compile(r"\.?\s*(\[\s*\d+%\])?$")


@pytest.fixture(autouse=True)
def _only_named_plugins(monkeypatch: pytest.MonkeyPatch, pytester: pytest.Pytester) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_shown=SUITE)


def _shown(result: pytest.RunResult) -> list[str]:
    """The lines --setup-show writes: SETUP, TEARDOWN, and each test's own line."""
    lines = []
    for line in result.outlines:
        if re.match(r"\s*(SETUP|TEARDOWN)\s", line):
            lines.append(line.rstrip())
        elif re.match(r" {8}test_\w+\.py::", line):
            lines.append(_AFTER_TEST_LINE.sub("", line.rstrip()))
    return lines


def _blocks(lines: list[str]) -> dict[str, list[str]]:
    """Each test's lines of its own (function scope: indented by eight), by test: its
    fixtures' SETUP lines, its own line, their TEARDOWN lines."""
    blocks: dict[str, list[str]] = {}
    current: list[str] = []
    for line in (line for line in lines if line.startswith(" " * 8)):
        starts = "::" in line or "SETUP" in line
        if starts and any("::" in seen for seen in current):
            current = []
        current.append(line)
        if "::" in line:
            blocks[line.split()[0]] = current
    return blocks


@pytest.mark.parametrize("option", ["--setup-show", "--setup-only", "--setup-plan"])
def test_the_lines_equal_plain_pytests(pytester: pytest.Pytester, lock: Path, option: str) -> None:
    plain = pytester.runpytest_subprocess("-p", "no:cacheprovider", option)
    one_worker = pytester.runpytest_subprocess(
        *IN_ORDER, f"--devpool-lock-dir={lock}", "--devices=sim:0", "--devpool-cpu-slots=1", option
    )

    assert _shown(plain), plain.outlines
    assert _shown(one_worker) == _shown(plain)


def test_each_tests_lines_stay_together_in_a_parallel_run(
    pytester: pytest.Pytester, lock: Path
) -> None:
    plain = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--setup-show")
    parallel = pytester.runpytest_subprocess(
        *IN_ORDER, f"--devpool-lock-dir={lock}", "--devices=sim:0-1", "--setup-show"
    )

    assert len(_blocks(_shown(plain))) == 4, plain.outlines
    assert _blocks(_shown(parallel)) == _blocks(_shown(plain))
