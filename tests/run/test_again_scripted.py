"""run/again.py's decision as the run loop carries it out, on scripted workers
(tests/run/fake_backend.py): which ending spends which reruns, what pytest hears of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

FAKE = Path(__file__).with_name("fake_backend.py")


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


def run(pytester: pytest.Pytester, source: str, *args: str) -> tuple[Any, list[dict[str, Any]]]:
    """A controller on scripted workers over test_s.py; its record's job ends."""
    pytester.makepyfile(fake_backend=FAKE.read_text(encoding="utf-8"), test_s=source)
    record = pytester.path / "record.jsonl"
    (pytester.path / "locks").mkdir()
    result = pytester.runpytest_subprocess(
        *("-p", "devpool.plugin", "-p", "no:cacheprovider", "-p", "no:randomly"),
        *("-p", "fake_backend", f"--devpool-lock-dir={pytester.path / 'locks'}"),
        f"--devpool-run-record={record}", "--devices", "sim:0", "--devpool-cpu-slots=1",
        *args,
        timeout=60,
    )  # fmt: skip
    lines = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    return result, [e for e in lines if e["type"] == "job_end"]


def ends(events: list[dict[str, Any]], name: str) -> list[tuple[int, str, bool]]:
    """Each attempt of the test: its number, its ending, whether it ran again."""
    return [(e["attempt"], e["outcome"], e["retried"]) for e in events if e["test"].endswith(name)]


def test_a_timeout_spends_a_failures_rerun_and_an_infra_ending_reruns_unheard(
    pytester: pytest.Pytester,
) -> None:
    result, events = run(
        pytester,
        "def test_hang_a(): pass\ndef test_missing_b(): pass\n",
        *("--devpool-reruns=1", "--devpool-test-timeout=0.3", "--devpool-timeout-grace=0.1"),
    )
    outcomes = result.parseoutcomes()
    # pytest hears the timeout's first attempt as a RERUN; the test that was never collected
    # did not start, so its first ending is no attempt of the test: pytest hears one infra.
    assert (outcomes.get("rerun"), outcomes.get("timeout"), outcomes.get("infra")) == (1, 1, 1)
    assert ends(events, "test_hang_a") == [(1, "timeout", True), (2, "timeout", False)]
    assert ends(events, "test_missing_b") == [(1, "infra", True), (2, "infra", False)]
    result.stdout.fnmatch_lines(
        ["*test_hang_a timeout; it runs again: attempt 2 (--devpool-reruns 1)*"]
    )


def test_failures_rerun_after_the_delay_and_a_crash_spends_only_infra_reruns(
    pytester: pytest.Pytester,
) -> None:
    source = "def test_fail_a(): pass\n\ndef test_crash_once_b(): pass\n"
    result, events = run(
        pytester,
        source,
        *("--devpool-reruns=2", "--devpool-reruns-delay=0.3", "--devpool-reruns-infra=0"),
    )
    assert ends(events, "test_fail_a") == [
        (1, "failed", True),
        (2, "failed", True),
        (3, "failed", False),
    ]
    assert ends(events, "test_crash_once_b") == [(1, "crashed", False)]  # reruns: not a crash's
    runs = [e for e in events if e["test"].endswith("test_fail_a")]
    for before, after in zip(runs, runs[1:], strict=False):
        assert after["start"] - before["end"] >= 0.29  # --devpool-reruns-delay, each time
    assert result.parseoutcomes().get("rerun") == 2, result.stdout.str()


def test_a_crash_is_its_own_failure_and_a_later_pass_is_flaky(pytester: pytest.Pytester) -> None:
    result, events = run(pytester, "def test_crash_once_a(): pass\n", "--devpool-reruns=0")
    # --devpool-reruns-infra (1) reruns the crash though --devpool-reruns is 0
    assert ends(events, "test_crash_once_a") == [(1, "crashed", True), (2, "flaky", False)]
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
