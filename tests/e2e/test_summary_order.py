"""The short test summary (-rA), the FAILURES section and devpool's own list of the tests
that did not pass name the tests in collection order, as plain pytest does, however the
workers finished them: here the first file's failing test ends last. Plain pytest runs the
same suite in the same test and is the expected value."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sessions import PRELUDE, events, run

SLOW = """
import os

def ended(path):
    # The tests the run record has as ended so far (the controller writes them as they end).
    lines = path.read_text().splitlines() if path.exists() else []
    events = [json.loads(line) for line in lines if line.endswith("}")]
    return {e["nodeid"] for e in events if e["type"] == "job_end"}


def test_slow_failure():
    # Under devpool it ends after the later files' failing tests (plain pytest runs it
    # first): it waits until the run record has them ended, not only started.
    record_file = os.environ.get("WAIT_FOR_OTHERS")
    if record_file:
        others = {"test_b.py::test_fails_fast", "test_c.py::test_fails_fast"}
        wait_until(lambda: others <= ended(Path(record_file)), "the others' failures")
    assert "slow" == "fast"

def test_passes_first():
    pass
"""

FAST = """
@pytest.fixture
def broken():
    raise RuntimeError("no fixture for {name}")

def test_fails_fast():
    record("{name}-fails")
    assert 1 == 2

def test_errors_fast(broken):
    pass

def test_passes():
    record("{name}-passes")

@pytest.mark.skip(reason="not today")
def test_skipped():
    pass
"""


@pytest.fixture(autouse=True)
def _only_named_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


def section(result: pytest.RunResult, title: str) -> list[str]:
    """The lines of one `=== title ===` section."""
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if re.match(rf"^=+ {title} =+$", line))
    end = next(i for i in range(start + 1, len(lines)) if re.match(r"^=+ .* =+$", lines[i]))
    return lines[start + 1 : end]


def failure_titles(result: pytest.RunResult) -> list[str]:
    """The tests FAILURES and ERRORS show, in order: `test_slow_failure`, ..."""
    titles = []
    for name in ("ERRORS", "FAILURES"):
        for line in section(result, name):
            found = re.match(r"^_+ (.+?) _+$", line)
            if found:
                titles.append(found.group(1))
    return titles


def test_summaries_list_tests_in_collection_order(
    pytester: pytest.Pytester, out: Path, lock: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(
        test_a=PRELUDE.format(out=str(out)) + SLOW,
        test_b=PRELUDE.format(out=str(out)) + FAST.replace("{name}", "b"),
        test_c=PRELUDE.format(out=str(out)) + FAST.replace("{name}", "c"),
    )
    expected = pytester.runpytest_subprocess(
        "-p", "devpool.plugin", "-p", "no:cacheprovider", "-rA", timeout=120
    )
    for path in out.glob("*.json"):
        path.unlink()

    monkeypatch.setenv("WAIT_FOR_OTHERS", str(pytester.path / "record.jsonl"))
    result = run(
        pytester,
        lock,
        "--devices=sim:0-3",
        "--devpool-cpu-slots=4",
        "--devpool-run-record=record.jsonl",
        "-rA",
    )

    ended = [e["test"] for e in events(pytester.path / "record.jsonl", "job_end")]
    assert ended.index("test_a.py::test_slow_failure") > ended.index("test_c.py::test_fails_fast")
    assert result.ret == expected.ret == 1
    shown = section(result, "short test summary info")
    assert shown == section(expected, "short test summary info")
    assert failure_titles(result) == failure_titles(expected)
    # devpool's own list: plain pytest's failures and errors, in the order it ran them.
    collected = pytester.runpytest_subprocess(
        "-p", "devpool.plugin", "-p", "no:cacheprovider", "--collect-only", "-q", timeout=120
    )
    failing = {line.split()[1] for line in shown if line.startswith(("FAILED", "ERROR"))}
    plain_order = [line for line in collected.outlines if line in failing]
    own = section(result, "devpool: 5 tests did not pass")
    named = [line.split()[1] for line in own if re.match(r"^(FAILED|ERROR)\b", line)]
    assert len(plain_order) == 5
    assert named == plain_order
