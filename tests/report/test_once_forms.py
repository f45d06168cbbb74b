"""Once-fixtures in the reports (issue 57): the record's once_* lines become one line per
fixture in `devpool report` (text, JSON), and its lease counts in the devices' use."""

from __future__ import annotations

import json
from pathlib import Path

from devpool.report.jsonout import render_json
from devpool.report.record import RecordWriter, read_record
from devpool.report.summary import summarize
from devpool.report.text import render_text


def write_run(folder: Path, lost: bool = False) -> Path:
    path = folder / "record.jsonl"
    writer = RecordWriter(path)
    writer.write("session_start", run_id="r1", host="h", pid=1, platform="sim",
                 devices=[0, 1], tests=1, options={}, planned=["t.py::test_a"])  # fmt: skip
    writer.write("once_start", fixture="server", devices=[1], ports=[20001], time=99.0)
    writer.write("once_setup", fixture="server", outcome="value", seconds=3.02, devices=[1],
                 ports=[20001], text="")  # fmt: skip
    writer.write("job_start", job=1, nodeid="t.py::test_a", devices=[0], attempt=1, log="")
    writer.write("job_end", job=1, nodeid="t.py::test_a", outcome="passed", devices=[0],
                 start=100.0, end=100.5, counted=["passed"])  # fmt: skip
    if lost:
        writer.write("once_lost", fixture="server", why="its process was killed by signal 9")
    else:
        writer.write("once_teardown", fixture="server", seconds=0.41, devices=[1],
                     ports=[20001], error=True, time=101.0)  # fmt: skip
    writer.write("session_end", exitstatus=0)
    writer.close()
    return path


def test_a_once_fixture_is_one_line_of_each_report_and_its_lease_counts(tmp_path: Path) -> None:
    record = read_record(write_run(tmp_path))
    text = render_text(record)
    assert (
        "  server: set up in 3.02s on sim:1, port 20001, torn down in 0.41s with an error" in text
    )
    [once] = json.loads(render_json(record))["once"]
    assert (once["fixture"], once["devices"], once["ports"]) == ("server", [1], [20001])
    use = {u.device: u for u in summarize(record).use}
    assert (use[1].busy, use[1].tested) == (2.0, 0.0)  # held by the fixture, no test's


def test_a_lost_once_fixture_says_why(tmp_path: Path) -> None:
    text = render_text(read_record(write_run(tmp_path, lost=True)))
    assert "server: set up in 3.02s on sim:1, port 20001; lost: its process was killed" in text
