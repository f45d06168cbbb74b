"""Devices run tests, not start-ups (issue 28): workers fork from warm templates, and no
lease is held while a worker starts. Read from the run record of real sessions over random
suites: from each lease to the first line of its first test, and each worker's start-up."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sessions import FAST, events

pytestmark = pytest.mark.usefixtures("_no_autoload")


@pytest.fixture
def _no_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def suite(sizes: list[tuple[int, float]]) -> str:
    lines = ["import time\n", "import pytest\n"]
    for i, (size, seconds) in enumerate(sizes):
        mark = f"@pytest.mark.device_count({size})\n" if size else ""
        lines.append(f"\n{mark}def test_{i}():\n    time.sleep({seconds})\n")
    return "".join(lines)


@settings(
    max_examples=4,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    sizes=st.lists(
        st.tuples(st.sampled_from([0, 1, 1, 2, 4, 8]), st.sampled_from([0.0, 0.01, 0.05])),
        min_size=4,
        max_size=30,
    )
)
def test_no_lease_is_held_while_its_worker_starts(
    pytester: pytest.Pytester, lock: Path, sizes: list[tuple[int, float]]
) -> None:
    for old in pytester.path.glob(".devpool/runs/*/record.jsonl"):
        old.unlink()
    pytester.makepyfile(test_mix=suite(sizes))
    result = pytester.runpytest_subprocess(
        *FAST, f"--devpool-lock-dir={lock}", "--devices", "sim:0-7", timeout=120
    )
    assert result.ret == 0, result.stdout.str()
    [record] = pytester.path.glob(".devpool/runs/*/record.jsonl")
    started = [e for e in events(record, "attempt") if e.get("state") == "started"]
    held = [e["lease_to_start"] for e in started if "lease_to_start" in e]
    leased = [e for e in events(record, "lease")]
    assert len(held) == len(leased)  # every lease reached its first test
    if held:
        # A fork: milliseconds on a quiet host (benchmarks/ml_suite.py measures it); a fresh
        # interpreter under its lease would take a second or more. Bounds with room for CI.
        assert statistics.median(held) <= 0.25, held
        assert max(held) < 1.0, held
    ready = events(record, "worker_ready")
    assert ready and all(e["worker_pid"] > 0 for e in ready)
    assert not [e for e in events(record, "fork_server")], "a template could not fork"


EDIT_LOOP = """
import pytest


@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(2))
def test_one(i):
    pass


@pytest.mark.device_count(2)
def test_two():
    pass
"""


def latest_record(pytester: pytest.Pytester) -> Path:
    return max(pytester.path.glob(".devpool/runs/*/record.jsonl"), key=lambda p: p.stat().st_mtime)


def test_the_history_starts_the_kinds_a_selection_needs_while_the_controller_collects(
    pytester: pytest.Pytester, lock: Path
) -> None:
    """The edit-run loop: after one run, `pytest file::test` finds its kind's template
    already collecting; a module the history has not seen gets a template that has it."""
    pytester.makepyfile(test_a=EDIT_LOOP)
    args = (*FAST, f"--devpool-lock-dir={lock}", "--devices", "sim:0-3")
    assert pytester.runpytest_subprocess(*args, timeout=120).ret == 0  # the history
    result = pytester.runpytest_subprocess(*args, "test_a.py::test_one[0]", timeout=120)
    assert result.ret == 0, result.stdout.str()
    [early] = events(latest_record(pytester), "early_templates")
    assert early == {**early, "kept": [1], "ended": []}, early
    pytester.makepyfile(
        test_new="import pytest\n\n@pytest.mark.device_count(1)\ndef test_new():\n    pass\n"
    )
    result = pytester.runpytest_subprocess(*args, "test_a.py", "test_new.py", timeout=120)
    assert result.ret == 0, result.stdout.str()
    assert "4 passed" in result.stdout.str()
    [early] = events(latest_record(pytester), "early_templates")
    # test_new.py is in no template the history could guess: a 1-device one is replaced.
    assert 1 not in early["kept"], early
