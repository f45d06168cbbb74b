"""What tests left behind (issue 52, the `leak` line) in every report form: the run's one
summary reads the lines, and the terminal's LEAK section, `devpool report` text, Markdown,
JSON and HTML, the GitHub annotations, the run diff and the history's rows all say them.

The records are written by the run's own RecordWriter, a leak line right before the job_end
of the attempt it is charged to, as the controller writes them.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from devpool.history.results import TestResult
from devpool.report.diff import diff_json, diff_markdown, diff_runs, diff_text
from devpool.report.github import GitHubLog
from devpool.report.html import render_html
from devpool.report.jsonout import render_json
from devpool.report.markdown import render_markdown
from devpool.report.record import LiveRecord, RecordWriter, read_record
from devpool.report.summary import summarize
from devpool.report.terminal import print_summary
from devpool.report.text import render_text
from devpool.session.past_runs import with_leaks

HOSTILE = "<img src=x onerror=alert(1)> | `tick`"
SERVER = "tests/test_srv.py::test_server"
FORK = "tests/test_srv.py::test_double_fork"
CLEAN = "tests/test_srv.py::test_clean"
SEEN = "pid 4242 `python -m http.server 30001` (sees sim:0; port 30001): terminated"


def leak(job: int, nodeid: str, **fields: Any) -> dict[str, Any]:
    """A `leak` line's fields as the lead's spec (notes/leak_record.md) gives them."""
    line: dict[str, Any] = {
        "job": job,
        "nodeid": nodeid,
        "attempt": 1,
        "kind": "process",
        "pid": 4242,
        "command": "python -m http.server 30001",
        "user": "ci",
        "holds": ["sim:0", "port 30001"],
        "fixture": None,
        "ended": "terminated",
        "devices": [0],
        "mode": "warn",
    }
    line.update(fields)
    return line


def write_run(
    folder: Path,
    tests: list[tuple[str, str, list[dict[str, Any]]]],
    mode: str | None = "warn",
    run_id: str = "r1",
) -> Path:
    """A finished run of (nodeid, outcome, its leak lines) on sim:0-1; `mode`: the run's
    --devpool-leaks (None: a record from before leaks were looked for)."""
    path = folder / run_id / "record.jsonl"
    writer = RecordWriter(path)
    options = {} if mode is None else {"leaks": mode}
    writer.write("session_start", run_id=run_id, host="h", pid=1, platform="sim",
                 devices=[0, 1], tests=len(tests), options=options,
                 planned=[nodeid for nodeid, _, _ in tests])  # fmt: skip
    for job, (nodeid, outcome, leaks) in enumerate(tests, 1):
        writer.write("job_start", job=job, nodeid=nodeid, devices=[0], attempt=1, log="")
        for fields in leaks:
            writer.write("leak", **{**fields, "job": job})
        writer.write("job_end", job=job, nodeid=nodeid, outcome=outcome, devices=[0],
                     start=100.0 + job, end=100.5 + job, counted=[outcome])  # fmt: skip
    writer.write("session_end", exitstatus=0)
    writer.close()
    return path


class Terminal:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write_sep(self, sep: str, title: str, **markup: Any) -> None:
        self.lines.append(f"{sep * 3} {title} {sep * 3}")

    def write_line(self, line: str, **markup: Any) -> None:
        self.lines.append(line)


LEAKY = [
    (SERVER, "passed", [leak(0, SERVER)]),
    (CLEAN, "passed", []),
    (
        FORK,
        "passed",
        [
            leak(0, FORK, pid=77, command=HOSTILE, holds=["sim:1"], ended="killed"),
            leak(
                0, FORK, kind="thread", pid=50, command="poller target=loop", holds=[], ended=""
            ),  # fmt: skip
            leak(0, FORK, pid=9, command="sleep 1000", user="other", ended="not permitted"),
        ],
    ),
]


def test_every_form_names_each_leak_with_what_it_held_and_how_it_ended(tmp_path: Path) -> None:
    record = read_record(write_run(tmp_path, LEAKY))
    summary = summarize(record)
    assert summary.leaked() == (SERVER, FORK)
    assert [(leak.nodeid, leak.pid, leak.ended) for leak in summary.leaks] == [
        (SERVER, 4242, "terminated"),
        (FORK, 77, "killed"),
        (FORK, 50, ""),
        (FORK, 9, "not permitted"),
    ]
    assert summary.leaks_checked
    # The terminal: one LEAK line a leak, in the words of the live line
    terminal = Terminal()
    print_summary(terminal, summary, tmp_path)
    leak_lines = [line for line in terminal.lines if line.startswith("LEAK")]
    assert leak_lines[0] == f"LEAK     {SERVER}: {SEEN}"
    assert (
        leak_lines[2] == f"LEAK     {FORK}: thread `poller target=loop` in worker pid 50: reported"
    )
    assert leak_lines[3].endswith("(sees sim:0; port 30001), user other: not permitted")
    assert "--- devpool: 4 leaks (2 tests left something behind) ---" in terminal.lines
    # `devpool report`: text, Markdown, JSON, HTML
    text = render_text(record)
    assert f"  {SERVER}: {SEEN}" in text.splitlines()
    assert "leaks (4, left behind by 2 tests):" in text
    markdown = render_markdown(record)
    rows = [line for line in markdown.splitlines() if line.startswith("| <code>")]
    assert len(rows) == 4
    assert all(row.count(" | ") == 3 for row in rows), rows  # the command's | stays in its cell
    assert "&lt;img src=x onerror=alert(1)&gt;" in markdown and "<img" not in markdown
    assert "**not permitted** (user other)" in markdown
    data = json.loads(render_json(record))
    assert data["leaked"] == [SERVER, FORK]
    assert data["leaks_checked"] is True
    assert data["leaks"][1]["command"] == HOSTILE
    assert data["leaks"][1]["holds"] == ["sim:1"]
    page = render_html(record)
    assert '<section class="leaks">' in page and "<img src=x" not in page
    assert html.escape("<img src=x onerror=alert(1)>") in page
    assert page.count('<tr class="leak') == 4 and page.count('<tr class="leak loud"') == 1
    # GitHub: a warning at the test, an error for one devpool may not end
    github = GitHubLog("sim", {SERVER: ("tests/test_srv.py", 9, "test_server")})
    notes = [line for line in github.annotations(summary) if "LEAK" in line]
    assert notes[0] == (
        "::warning file=tests/test_srv.py,line=10,title=LEAK tests/test_srv.py%3A%3Atest_server"
        f"::{SEEN}"
    )
    assert [note.split(" ", 1)[0] for note in notes] == ["::warning"] * 3 + ["::error"]


def test_a_run_without_leak_lines_says_nothing_of_leaks(tmp_path: Path) -> None:
    """No leak, or a record from before leaks were looked for: no section anywhere."""
    for mode in ("warn", None):
        record = read_record(write_run(tmp_path / str(mode), LEAKY[1:2], mode=mode))
        summary = summarize(record)
        assert summary.leaks == () and summary.leaks_checked is (mode == "warn")
        terminal = Terminal()
        print_summary(terminal, summary, tmp_path)
        assert not any("leak" in line.lower() for line in terminal.lines)
        assert "leak" not in render_text(record) + render_markdown(record)
        assert "leaks" not in render_html(record)
        assert json.loads(render_json(record))["leaks"] == []


def test_the_live_record_reads_a_leak_as_the_file_does(tmp_path: Path) -> None:
    """The terminal's summary rests on the live record: the same reading as the file's."""
    path = write_run(tmp_path, LEAKY)
    live = LiveRecord(path)
    for line in path.read_text().splitlines():
        event = json.loads(line)
        live.event(event.pop("type"), event)
    assert summarize(live.record).leaks == summarize(read_record(path)).leaks


def test_the_diff_lists_new_fixed_and_remaining_leaks(tmp_path: Path) -> None:
    old = write_run(tmp_path, LEAKY, run_id="old")
    new_tests = [
        (SERVER, "passed", [leak(0, SERVER, pid=5151)]),  # still leaking
        (CLEAN, "failed", [leak(0, CLEAN, command="nc -l 30002", holds=["port 30002"])]),
        (FORK, "passed", []),  # no longer leaking
    ]
    new = write_run(tmp_path, new_tests, run_id="new")
    diff = diff_runs(summarize(read_record(old)), summarize(read_record(new)))
    assert [c.nodeid for c in diff.newly_leaking] == [CLEAN]
    assert [c.nodeid for c in diff.no_longer_leaking] == [FORK]
    assert [c.nodeid for c in diff.still_leaking] == [SERVER]
    text = diff_text(diff)
    assert f"  {CLEAN}: leaked pid 4242 `nc -l 30002` (sees port 30002): terminated" in text
    assert "no longer leaking (1):" in text
    assert f"  {FORK}: no leak (OLD: pid 77 `{HOSTILE}` (sees sim:1): killed and 2 more)" in text
    assert "&lt;img" in diff_markdown(diff) and "<img" not in diff_markdown(diff)
    data = json.loads(diff_json(diff))
    assert data["still_leaking"][0]["new"].startswith("pid 5151 ")
    assert data["no_longer_leaking"][0]["old_count"] == 3
    # NEW did not look: nothing it left is known, so no leak counts as fixed
    unlooked = write_run(tmp_path, new_tests[2:], mode="off", run_id="off")
    diff = diff_runs(summarize(read_record(old)), summarize(read_record(unlooked)))
    assert diff.no_longer_leaking == ()


def test_history_rows_carry_each_tests_leaks_over_its_attempts(tmp_path: Path) -> None:
    """What the controller adds to the history: the leaks of each result's job; None
    where the run did not look."""
    path = write_run(tmp_path, LEAKY)

    def result(nodeid: str, job: int) -> TestResult:
        return TestResult(nodeid, "passed", 0.5, "sim", 1, "sim-2", 100.5 + job + 1e-5, "r1")

    results = [result(SERVER, 1), result(CLEAN, 2), result(FORK, 3)]
    record = read_record(path)
    assert [r.leaks for r in with_leaks(results, record)] == [1, 0, 3]
    unlooked = read_record(write_run(tmp_path / "off", LEAKY[1:2], mode="off"))
    assert [r.leaks for r in with_leaks(results, unlooked)] == [None, None, None]
