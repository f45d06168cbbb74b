"""The live status line: when it shows, and what it says."""

from __future__ import annotations

import io
import sys

import pytest
from rich.console import Console

from devpool.report.progress import LiveProgress, RunningJob, Snapshot, line, render, wanted


class Option:
    verbose = 0


def text_of(snapshot: Snapshot) -> str:
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(render(snapshot))
    out = console.file
    assert isinstance(out, io.StringIO)
    return out.getvalue()


def test_one_line_names_running_tests_queue_done_devices_and_who_blocks_us() -> None:
    snapshot = Snapshot(
        devices_total=8,
        devices_busy=6,
        queued=40,
        running=[RunningJob(f"tests/t.py::test_{i}", f"sim:{i}", float(i)) for i in range(10)],
        done=120,
        waiting_on="sim:7 held by pid 4242 (user ci2)",
        counts={"passed": 118, "failed": 2},
    )
    assert line(snapshot) == (
        "devpool: done 120 (118 passed, 2 failed) · queued 40 · devices 6/8 busy · "
        "running 10: tests/t.py::test_9 9s [sim:9], tests/t.py::test_8 8s [sim:8], "
        "+8 more · waiting for sim:7 held by pid 4242 (user ci2)"
    )
    shown = text_of(snapshot)
    assert len(shown.splitlines()) == 1 and shown.rstrip().endswith("…")  # cut to the width
    assert shown.startswith("devpool: done 120 (118 passed, 2 failed) · queued 40")
    idle = Snapshot(devices_total=2, devices_busy=0, queued=0, running=[], done=0)
    assert line(idle) == "devpool: done 0 · queued 0 · devices 0/2 busy · running 0"


def test_no_live_line_in_ci_when_very_quiet_or_when_piped() -> None:
    assert not wanted(Option(), {"CI": "true"})
    assert not wanted(Option(), {"GITHUB_ACTIONS": "true"})
    assert not wanted(Option(), {"TERM": "dumb"})
    very_quiet = Option()
    very_quiet.verbose = -2
    assert not wanted(very_quiet, {})
    # pytest's own output is not a terminal here (captured): no line either.
    assert not wanted(Option(), {})


def test_live_line_on_a_terminal_even_with_q(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    quiet = Option()
    quiet.verbose = -1
    assert wanted(quiet, {}) and wanted(Option(), {"CI": "false"})
    assert not wanted(Option(), {"CI": "true"})


class Writer:
    """pytest's TerminalWriter as far as the panel touches it: a `_file` to write to."""

    def __init__(self) -> None:
        self._file = io.StringIO()


def test_pytest_lines_pass_through_whole_and_partial_lines_wait() -> None:
    writer = Writer()
    original = writer._file
    with LiveProgress(writer) as live:
        writer._file.write("collected 3 items\n...")
        live.update(Snapshot(3, 1, 0, [], 2), force=True)
        assert writer._file is not original  # routed above the panel while live
    assert writer._file is original
    out = original.getvalue()
    assert "collected 3 items" in out
    assert out.rstrip().endswith("...")  # the partial progress line is written at the end
