"""The words of the text reports: counts in the singular where they are one, and
utilisation that keeps lease time and the tests' own time apart."""

from __future__ import annotations

import json
from pathlib import Path

from test_record import T0, _job, _start, write_record

from devpool.report.jsonout import render_json
from devpool.report.markdown import render_markdown
from devpool.report.record import read_record
from devpool.report.text import render_text
from devpool.wording import counted


def test_counted_says_one_in_the_singular() -> None:
    assert [counted(n, "device") for n in (0, 1, 2)] == ["0 devices", "1 device", "2 devices"]
    assert counted(1, "entry", "entries") == "1 entry"
    assert counted(3, "entry", "entries") == "3 entries"


def test_a_one_device_run_reads_1_device(tmp_path: Path) -> None:
    events = [
        _start(1, devices=[0]),
        *_job(0, "t.py::test_a", [0], T0, outcome="failed", run_time=0.5),
        ("session_end", {"exitstatus": 1, "duration": 2.0, "troubles": {"failed": 1}}),
    ]
    record = read_record(write_record(tmp_path / "r.jsonl", events))
    for text in (render_text(record), render_markdown(record)):
        assert "(1 device)" in text and "1 devices" not in text
        assert "1 test did not pass" in text and "1 tests" not in text


def test_utilisation_keeps_lease_time_and_test_time_apart(tmp_path: Path) -> None:
    # The lease held sim:0 for 2 s (worker start-up included); the test ran 0.1 s of it.
    events = [
        (
            "session_start",
            {**_start(1, devices=[0])[1], "time": T0},
        ),
        *_job(0, "t.py::test_a", [0], T0, outcome="passed", run_time=0.1),
        ("session_end", {"exitstatus": 0, "duration": 2.0, "troubles": {}}),
    ]
    path = write_record(tmp_path / "r.jsonl", events)
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    first["time"] = T0
    last = json.loads(lines[-1])
    last["time"] = T0 + 2.0
    start = json.loads(lines[1])
    start["time"] = T0
    path.write_text(
        "\n".join(json.dumps(e) for e in [first, start, *map(json.loads, lines[2:-1]), last]) + "\n"
    )
    record = read_record(path)
    text = render_text(record)
    assert "sim:0 leased 100%, tests 5%" in text, text
    data = json.loads(render_json(record))
    assert data["utilisation"] == {"0": 1.0} and data["test_utilisation"] == {"0": 0.05}
    assert "| sim:0 | 100% | 5% | 1 |" in render_markdown(record)
