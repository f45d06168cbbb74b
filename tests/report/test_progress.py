"""The live progress panel: when it shows, and what it says."""

from __future__ import annotations

import io

from rich.console import Console

from devpool.report.progress import LiveProgress, RunningJob, Snapshot, render, wanted


class Option:
    verbose = 0


def text_of(snapshot: Snapshot) -> str:
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(render(snapshot))
    out = console.file
    assert isinstance(out, io.StringIO)
    return out.getvalue()


def test_panel_shows_devices_queue_running_jobs_and_who_blocks_us() -> None:
    snapshot = Snapshot(
        devices_total=8,
        devices_busy=6,
        queued=40,
        running=[RunningJob(f"tests/t.py::test_{i}", f"sim:{i}", float(i)) for i in range(10)],
        done=120,
        waiting_on="sim:7 held by pid 4242 (user ci2)",
        counts={"passed": 118, "failed": 2},
    )
    shown = text_of(snapshot)
    assert "devices 6/8 busy · queued 40 · running 10 · done 120 (118 passed, 2 failed)" in shown
    assert "tests/t.py::test_9" in shown  # longest-running first
    assert "tests/t.py::test_0" not in shown  # only eight lines of running jobs
    assert "… and 2 more" in shown
    assert "waiting for sim:7 held by pid 4242 (user ci2)" in shown


def test_no_live_panel_in_ci_when_quiet_or_when_piped() -> None:
    assert not wanted(Option(), {"CI": "true"})
    assert not wanted(Option(), {"GITHUB_ACTIONS": "true"})
    assert not wanted(Option(), {"TERM": "dumb"})
    quiet = Option()
    quiet.verbose = -1
    assert not wanted(quiet, {})
    # pytest's own output is not a terminal here (captured): no panel either.
    assert not wanted(Option(), {})


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
