"""Unit tests of the run record (record.py) and the reports rendered from it (report/)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from devpool import cli
from devpool.errors import DevpoolError
from devpool.report import github
from devpool.report.github import GitHubLog, annotation, escape_data, escape_property
from devpool.report.jsonout import render_json
from devpool.report.markdown import render_markdown
from devpool.report.record import SCHEMA_VERSION, LiveRecord, RecordWriter, read_record
from devpool.report.summary import summarize
from devpool.report.text import render_text

T0 = 1_700_000_000.0

Event = tuple[str, dict[str, Any]]


def _job(job: int, nodeid: str, devices: list[int], start: float, **end: Any) -> list[Event]:
    """A job_start and (unless end is empty) a job_end event for one attempt."""
    events: list[Event] = [
        (
            "job_start",
            {
                "job": job,
                "nodeid": nodeid,
                "devices": devices,
                "host": "h",
                "worker_pid": 1000 + job,
                "queue_wait": 0.25,
                "attempt": end.get("attempt", 1),
                "log": f"/logs/worker-{job}.log",
            },
        )
    ]
    if end:
        fields = {
            "job": job,
            "nodeid": nodeid,
            "devices": devices,
            "host": "h",
            "start": start,
            "end": start + 2.0,
            "run_time": 2.0,
            "queue_wait": 0.25,
            "attempt": 1,
            "log": "",
            "detail": "",
            "tail": [],
        }
        fields.update(end)
        events.append(("job_end", fields))
    return events


def _start(tests: int, devices: list[int] | None = None) -> Event:
    return (
        "session_start",
        {
            "run_id": "run-1",
            "host": "h",
            "pid": 1,
            "args": [],
            "cwd": "/",
            "platform": "sim",
            "kind": "sim",
            "devices": [0, 1] if devices is None else devices,
            "options": {},
            "tests": tests,
        },
    )


def write_record(path: Path, events: Iterable[Event]) -> Path:
    writer = RecordWriter(path)
    for event_type, fields in events:
        writer.write(event_type, **fields)
    writer.close()
    return path


def finished_events() -> list[Event]:
    return [
        _start(3),
        *_job(0, "t.py::test_a", [0], T0, outcome="passed"),
        *_job(
            1,
            "t.py::test_b",
            [1],
            T0,
            outcome="failed",
            log="/logs/t.py_test_b.log",
            detail="failed (worker log worker-1.log)",
            tail=["E   assert 1 == 2", "t.py:7: AssertionError"],
        ),
        *_job(2, "t.py::test_c", [], T0, outcome="passed"),
        ("session_end", {"exitstatus": 1, "duration": 3.0, "troubles": {"failed": 1}}),
    ]


def cut_events() -> list[Event]:
    """Five tests planned; two ended (one failing), one still running, two never started."""
    return [
        _start(5),
        *_job(0, "t.py::test_a", [0], T0, outcome="passed"),
        *_job(
            1,
            "t.py::test_b",
            [1],
            T0,
            outcome="failed",
            log="/logs/t.py_test_b.log",
            detail="failed",
            tail=["E   AssertionError: cut-run-marker"],
        ),
        *_job(2, "t.py::test_c", [0], T0),
    ]


def one_sentence(text: str) -> None:
    assert "\n" not in text.strip(), text
    assert "Traceback" not in text


# ---- RecordWriter and read_record ---------------------------------------------------------


def test_round_trip_keeps_every_event(tmp_path: Path) -> None:
    path = write_record(tmp_path / "deep" / "record.jsonl", finished_events())
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert all(line["v"] == SCHEMA_VERSION and "time" in line for line in lines)
    assert [line["type"] for line in lines][0] == "session_start"

    record = read_record(path)
    assert record.finished and record.damage is None
    assert record.platform == "sim" and record.devices == [0, 1] and record.total_tests == 3
    assert [(job.nodeid, job.outcome, job.devices) for job in record.jobs] == [
        ("t.py::test_a", "passed", [0]),
        ("t.py::test_b", "failed", [1]),
        ("t.py::test_c", "passed", []),
    ]
    failed = record.jobs[1]
    assert failed.tail == ["E   assert 1 == 2", "t.py:7: AssertionError"]
    assert failed.log == "/logs/t.py_test_b.log" and failed.queue_wait == 0.25
    assert failed.start is not None and failed.end == T0 + 2.0
    assert record.cut_sentence() is None
    summary = summarize(record)
    assert summary.counts() == [("failed", 1), ("passed", 2)]  # the closing line's order
    assert [ending.job.nodeid for ending in summary.troubles] == ["t.py::test_b"]


def test_writer_keeps_non_ascii_and_odd_values(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    events = [_start(1), *_job(0, "t.py::test_ü[α]", [0], T0, outcome="passed", where=tmp_path)]
    write_record(path, events)
    assert "test_ü[α]" in path.read_text(encoding="utf-8")
    assert read_record(path).jobs[0].nodeid == "t.py::test_ü[α]"


def test_rerun_counts_the_last_attempt_only(tmp_path: Path) -> None:
    events = [
        _start(1),
        *_job(0, "t.py::test_a", [0], T0, outcome="failed", attempt=1),
        *_job(1, "t.py::test_a", [1], T0 + 3, outcome="passed", attempt=2),
    ]
    record = read_record(write_record(tmp_path / "r.jsonl", events))
    assert len(record.jobs) == 2
    summary = summarize(record)
    assert summary.counts() == [("passed", 1)]  # an older record: no `counted`, no `retried`
    assert summary.troubles == ()


def test_record_cut_mid_line_reads_up_to_the_damage(tmp_path: Path) -> None:
    path = write_record(tmp_path / "r.jsonl", finished_events())
    raw = path.read_bytes()
    lines = raw.splitlines(keepends=True)
    last = lines[-1]
    path.write_bytes(b"".join(lines[:-1]) + last[: len(last) // 2])

    record = read_record(path)
    assert not record.finished
    assert record.damage is not None
    one_sentence(record.damage)
    assert f"line {len(lines)}" in record.damage and "cut off" in record.damage
    assert str(path) in record.damage
    # Everything before the cut survives.
    assert [job.outcome for job in record.jobs] == ["passed", "failed", "passed"]
    assert record.cut_sentence() is not None


def test_record_cut_inside_a_multibyte_character(tmp_path: Path) -> None:
    events = [_start(1), *_job(0, "t.py::test_a", [0], T0, outcome="failed", tail=["ééééé"])]
    path = write_record(tmp_path / "r.jsonl", events)
    raw = path.read_bytes()
    cut = raw.rindex("é".encode()) + 1  # between the two bytes of the last é
    path.write_bytes(raw[:cut])
    record = read_record(path)
    assert record.damage is not None and "line 3" in record.damage and "cut off" in record.damage
    assert [job.outcome for job in record.jobs] == [None]


def test_line_that_is_not_json_in_the_middle(tmp_path: Path) -> None:
    path = write_record(tmp_path / "r.jsonl", finished_events())
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines.insert(3, "this is not json at all\n")
    path.write_text("".join(lines), encoding="utf-8")

    record = read_record(path)
    assert record.damage is not None
    one_sentence(record.damage)
    assert "line 4" in record.damage and "not JSON" in record.damage
    assert "cut off" not in record.damage
    # Lines 1-3 were read (session_start, job 0 start and end); nothing after the damage.
    assert [(job.nodeid, job.outcome) for job in record.jobs] == [("t.py::test_a", "passed")]
    assert not record.finished


def test_newer_schema_version_stops_reading_with_a_sentence(tmp_path: Path) -> None:
    path = write_record(tmp_path / "r.jsonl", finished_events()[:3])
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"v": 2, "type": "job_start", "time": T0, "job": 9}) + "\n")
        handle.write(json.dumps({"v": 1, "type": "session_end", "time": T0, "exitstatus": 0}))
        handle.write("\n")
    record = read_record(path)
    assert record.damage is not None
    one_sentence(record.damage)
    assert "line 4" in record.damage and "schema version 2" in record.damage
    assert not record.finished  # the session_end after the refused line is not read
    assert [job.job for job in record.jobs] == [0]


def test_newer_schema_version_on_the_first_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"v": 2, "type": "session_start", "time": T0}) + "\n")
    with pytest.raises(DevpoolError) as info:
        read_record(path)
    one_sentence(str(info.value))
    assert "schema version 2" in str(info.value) and str(path) in str(info.value)


def test_empty_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    with pytest.raises(DevpoolError) as info:
        read_record(path)
    one_sentence(str(info.value))
    assert str(path) in str(info.value) and "empty" in str(info.value)


def test_non_record_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello\nworld\n")
    with pytest.raises(DevpoolError) as info:
        read_record(path)
    one_sentence(str(info.value))
    assert str(path) in str(info.value) and "not a devpool run record" in str(info.value)


def test_json_that_is_not_a_record_is_not_called_a_newer_version(tmp_path: Path) -> None:
    # A package.json given by mistake: no "v" at all, so upgrading devpool would not help.
    path = tmp_path / "package.json"
    path.write_text('{"name": "x", "version": "1.0.0"}\n')
    with pytest.raises(DevpoolError) as info:
        read_record(path)
    one_sentence(str(info.value))
    assert "not a devpool run record" in str(info.value)
    assert "upgrade" not in str(info.value)


def test_record_without_session_start_is_not_called_empty(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"v": 1, "type": "job_start", "time": T0, "job": 0}) + "\n")
    with pytest.raises(DevpoolError) as info:
        read_record(path)
    one_sentence(str(info.value))
    assert "session_start" in str(info.value) and str(path) in str(info.value)
    assert "empty" not in str(info.value)  # it has a line; what it lacks is a session_start


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DevpoolError) as info:
        read_record(tmp_path / "nope.jsonl")
    one_sentence(str(info.value))
    assert "nope.jsonl" in str(info.value)


@pytest.mark.parametrize(
    "content", [b"", b"hello\nworld\n", b"\xff\xfe\x00binary", b"[1, 2, 3]\n"], ids=repr
)
def test_devpool_report_on_a_bad_file_exits_4_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    code = cli.main(["report", str(path)])
    out, err = capsys.readouterr()
    assert code == 4
    assert out == ""
    assert err.startswith("devpool: error: ") and str(path) in err
    one_sentence(err)


def test_cut_sentence_for_a_record_without_session_end(tmp_path: Path) -> None:
    record = read_record(write_record(tmp_path / "r.jsonl", cut_events()))
    assert not record.finished and record.damage is None
    sentence = record.cut_sentence()
    assert sentence is not None
    assert "did not finish" in sentence and "2 of 5 tests ran" in sentence
    counts = summarize(record).counts()
    assert counts == [("failed", 1), ("passed", 1), ("interrupted", 1), ("not run", 2)]


# ---- text, markdown, json ----------------------------------------------------------------


def test_render_text_of_a_cut_run(tmp_path: Path) -> None:
    text = render_text(read_record(write_record(tmp_path / "r.jsonl", cut_events())))
    assert "did not finish" in text and "2 of 5 tests ran" in text
    assert "1 passed" in text and "1 failed" in text and "1 interrupted" in text
    assert "2 not run" in text
    assert "t.py::test_b" in text and "cut-run-marker" in text
    assert "/logs/t.py_test_b.log" in text


def test_render_text_of_a_finished_run(tmp_path: Path) -> None:
    text = render_text(read_record(write_record(tmp_path / "r.jsonl", finished_events())))
    assert "did not finish" not in text
    assert "2 passed" in text and "1 failed" in text and "exit code 1" in text
    assert "E   assert 1 == 2" in text and "sim:1" in text


def test_render_text_shows_damage(tmp_path: Path) -> None:
    path = write_record(tmp_path / "r.jsonl", finished_events())
    raw = path.read_bytes()
    path.write_bytes(raw[:-10])
    text = render_text(read_record(path))
    assert "cut off" in text and "did not finish" in text


def test_render_markdown_of_a_cut_run(tmp_path: Path) -> None:
    md = render_markdown(read_record(write_record(tmp_path / "r.jsonl", cut_events())))
    assert "did not finish" in md and "2 of 5 tests ran" in md
    assert "| outcome | tests |" in md
    assert "| passed | 1 |" in md and "| failed | 1 |" in md and "| not run | 2 |" in md
    assert "| interrupted | 1 |" in md and "- `t.py::test_c`" in md
    assert "cut-run-marker" in md and "t.py::test_b" in md


def test_render_markdown_escapes_html_and_strips_ansi(tmp_path: Path) -> None:
    events = [
        _start(1),
        *_job(
            0,
            "t.py::test_x[<script>alert(1)</script>]",
            [0],
            T0,
            outcome="failed",
            detail="<b>detail</b>",
            tail=["\x1b[31mred <script>alert(2)</script>\x1b[0m", "</pre></details>"],
        ),
        ("session_end", {"exitstatus": 1, "duration": 1.0, "troubles": {"failed": 1}}),
    ]
    md = render_markdown(read_record(write_record(tmp_path / "r.jsonl", events)))
    assert "<script>" not in md and "</script>" not in md
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in md
    assert "red &lt;script&gt;alert(2)&lt;/script&gt;" in md
    assert "\x1b" not in md and "[31m" not in md
    assert "<b>detail</b>" not in md
    # The tail cannot close the <pre> or <details> devpool opened.
    assert md.count("</pre>") == 1 and md.count("</details>") == md.count("<details")


def test_render_json_of_a_cut_run(tmp_path: Path) -> None:
    data = json.loads(render_json(read_record(write_record(tmp_path / "r.jsonl", cut_events()))))
    assert data["finished"] is False and data["exitstatus"] is None
    assert "did not finish" in data["verdict"] and "2 of 5 tests ran" in data["verdict"]
    assert data["totals"] == {"passed": 1, "failed": 1, "interrupted": 1, "not run": 2}
    assert data["tests"]["interrupted"] == ["t.py::test_c"]
    by_node = {job["nodeid"]: job for job in data["jobs"]}
    assert by_node["t.py::test_a"]["outcome"] == "passed"
    assert by_node["t.py::test_b"]["tail"] == ["E   AssertionError: cut-run-marker"]
    assert by_node["t.py::test_c"]["outcome"] is None  # still running when the run was cut


def test_render_json_of_a_finished_run(tmp_path: Path) -> None:
    data = json.loads(
        render_json(read_record(write_record(tmp_path / "r.jsonl", finished_events())))
    )
    assert data["finished"] is True and data["exitstatus"] == 1 and data["damage"] is None
    assert data["totals"] == {"passed": 2, "failed": 1}
    assert [job["outcome"] for job in data["jobs"]] == ["passed", "failed", "passed"]
    assert data["jobs"][1]["devices"] == [1] and data["jobs"][1]["end"] == T0 + 2.0


# ---- GitHub --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "data", "prop"),
    [
        ("plain", "plain", "plain"),
        ("50%", "50%25", "50%25"),
        ("a\r\nb", "a%0D%0Ab", "a%0D%0Ab"),
        ("t.py::test_a", "t.py::test_a", "t.py%3A%3Atest_a"),
        ("x,y", "x,y", "x%2Cy"),
        ("%0A", "%250A", "%250A"),  # an already escaped-looking text is escaped again
        ("::error::x", "::error::x", "%3A%3Aerror%3A%3Ax"),
    ],
)
def test_escape_data_and_property(text: str, data: str, prop: str) -> None:
    assert escape_data(text) == data
    assert escape_property(text) == prop


def test_annotation_escapes_its_parts() -> None:
    line = annotation("FAILED t.py::test_a", "boom\n::set-output name=x::y", "dir,x/t.py", 7)
    assert line == (
        "::error file=dir%2Cx/t.py,line=7,title=FAILED t.py%3A%3Atest_a"
        "::boom%0A::set-output name=x::y"
    )
    assert "\n" not in line


def _ended(nodeid: str, outcome: str, log: Path | None, **extra: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "job": 0,
        "nodeid": nodeid,
        "outcome": outcome,
        "devices": [2],
        "run_time": 0.5,
        "queue_wait": 0.1,
        "log": str(log) if log is not None else "",
        "detail": "failed",
        "tail": [],
    }
    fields.update(extra)
    return fields


def test_groups_fence_test_output_from_commands(
    tmp_path: Path, unfenced: Callable[[list[str]], list[str]]
) -> None:
    log = tmp_path / "t.log"
    log.write_text(
        "header\n::error::pwned\n::set-output name=x::y\n::endgroup::\n"
        "::stop-commands::guess\nwith\rcarriage return\n::error::pwned-again\n",
        encoding="utf-8",
    )
    gh = GitHubLog("sim", {})
    gh.event("job_start", {"nodeid": "t.py::test_a"})  # only job_end matters
    gh.event("job_end", _ended("t.py::test_a", "failed", log))
    gh.event("job_end", _ended("t.py::test_b", "passed", None, devices=[]))
    lines = gh.groups()
    assert all("\n" not in line and "\r" not in line for line in lines)

    outside = unfenced(lines)
    assert not [line for line in outside if line.startswith(("::error", "::set-output"))]
    assert outside.count("::endgroup::") == 2
    assert [line for line in outside if line.startswith("::group::")] == [
        "::group::FAILED t.py::test_a [sim:2] 0.50s, queue 0.10s",
        "::group::PASSED t.py::test_b [cpu] 0.50s, queue 0.10s",
    ]
    # The output itself is all there, inside the fence.
    assert "::error::pwned" in lines and "::set-output name=x::y" in lines
    assert "::error::pwned-again" in lines
    # The fence's token is unguessable (the log's own stop-commands line is inside it).
    token = lines[lines.index("::group::FAILED t.py::test_a [sim:2] 0.50s, queue 0.10s") + 1]
    assert token.startswith("::stop-commands::") and token != "::stop-commands::guess"
    assert len(token) >= len("::stop-commands::") + 16


def test_group_heads_cannot_inject_a_command(tmp_path: Path) -> None:
    gh = GitHubLog("sim", {})
    gh.event("job_end", _ended("t.py::test_a[x\n::error::pwned]", "failed", None))
    lines = gh.groups()
    assert all("\n" not in line for line in lines)
    assert not [line for line in lines if line.startswith("::error")]


def test_groups_survive_invalid_utf8_in_a_log(tmp_path: Path) -> None:
    log = tmp_path / "t.log"
    log.write_bytes(b"before\n\xff\xfe bad bytes \xc3\n after\n")
    gh = GitHubLog("sim", {})
    gh.event("job_end", _ended("t.py::test_a", "failed", log))
    lines = gh.groups()
    assert "before" in lines and " after" in lines
    assert "\ufffd\ufffd bad bytes \ufffd" in lines


def test_annotations_point_at_file_and_1_based_line() -> None:
    locations = {
        "tests/t.py::test_a": ("tests/t.py", 9, "test_a"),
        "tests/t.py::test_b": ("tests/t.py", 19, "test_b"),
        "tests/t.py::test_c": ("tests/t.py", 29, "test_c"),
    }
    gh = GitHubLog("sim", locations)
    gh.event(
        "job_end",
        _ended("tests/t.py::test_a", "failed", None, tail=["E  boom", "::set-output name=a::b"]),
    )
    gh.event("job_end", _ended("tests/t.py::test_b", "passed", None))
    gh.event("job_end", _ended("tests/t.py::test_c", "timeout", None, devices=[0, 1]))
    gh.event("job_end", _ended("other.py::test_d", "crashed", None))
    live = LiveRecord(Path("r.jsonl"))
    live.event("session_start", {"platform": "sim", "devices": [0, 1, 2], "tests": 4})
    for number, fields in enumerate(gh.ended):
        live.event("job_end", {**fields, "job": number})
    lines = gh.annotations(summarize(live.record))
    assert len(lines) == 3
    assert lines[0].startswith(
        "::error file=tests/t.py,line=10,title=FAILED tests/t.py%3A%3Atest_a::"
    )
    assert "E  boom%0A::set-output name=a::b" in lines[0]
    assert lines[1].startswith("::error file=tests/t.py,line=30,title=TIMEOUT ")
    assert "sim%3A0%2C1" in lines[1]
    # No known location: the file from the node id, no line.
    assert lines[2].startswith("::error file=other.py,title=CRASHED other.py%3A%3Atest_d")
    assert all("\n" not in line for line in lines)


def test_enabled_flag_wins_over_environment() -> None:
    assert github.enabled(None, {"GITHUB_ACTIONS": "true"})
    assert not github.enabled(None, {})
    assert not github.enabled(False, {"GITHUB_ACTIONS": "true"})
    assert github.enabled(True, {})


def test_write_step_summary_appends_markdown(tmp_path: Path) -> None:
    record = read_record(write_record(tmp_path / "r.jsonl", finished_events()))
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n", encoding="utf-8")
    assert github.write_step_summary(record, {"GITHUB_STEP_SUMMARY": str(summary)})
    text = summary.read_text(encoding="utf-8")
    assert text.startswith("earlier step\n") and "| failed | 1 |" in text
    assert not github.write_step_summary(record, {})


def test_buffered_lines_reach_the_disk_once_they_have_waited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import devpool.report.record as record_module

    clock = [100.0]
    monkeypatch.setattr(record_module.time, "monotonic", lambda: clock[0])
    path = tmp_path / "record.jsonl"
    writer = RecordWriter(path)
    writer.write("session_start", run_id="r")
    writer.write("job_start", job=1, nodeid="t.py::test_a")  # waits in memory
    writer.flush_due()
    assert "job_start" not in path.read_text()  # not yet due: it may wait with others
    clock[0] += record_module.BUFFER_SECONDS
    writer.flush_due()
    assert "job_start" in path.read_text()  # a long test's start is on disk while it runs
    writer.close()


def test_the_writer_leaves_out_what_job_end_says(tmp_path: Path) -> None:
    """5 lines a test, not 9 (issue 45): an ordinary ending's reported and concluded moves
    and its passed setup and teardown reports are not written; other endings' moves, the
    call's report and a phase that did not pass are."""
    path = tmp_path / "r.jsonl"
    writer = RecordWriter(path)
    emit = writer.write

    for job, ending in ((1, "reported"), (2, "timed-out")):
        for state in ("sent", "started", ending):
            emit("attempt", job=job, nodeid=f"t.py::t{job}", attempt=1, state=state)
        emit("report", nodeid=f"t.py::t{job}", when="setup", outcome="passed", duration=0.0)
        emit("report", nodeid=f"t.py::t{job}", when="call", outcome="passed", duration=0.0)
        emit("report", nodeid=f"t.py::t{job}", when="teardown", outcome="failed", duration=0.0)
        emit("job_end", job=job, nodeid=f"t.py::t{job}", outcome="passed")
        emit("attempt", job=job, nodeid=f"t.py::t{job}", attempt=1, state="concluded")
    writer.close()
    written = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    kept = [(e["type"], str(e.get("state") or e.get("when") or "")) for e in written]
    assert kept == [
        ("attempt", "sent"),
        ("attempt", "started"),
        ("report", "call"),
        ("report", "teardown"),  # it failed: said
        ("job_end", ""),
        ("attempt", "sent"),
        ("attempt", "started"),
        ("attempt", "timed-out"),
        ("report", "call"),
        ("report", "teardown"),
        ("job_end", ""),
        ("attempt", "concluded"),  # after timed-out, not after reported: said
    ]
