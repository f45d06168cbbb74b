"""The HTML timeline report: from hand-written records, then from a real demo run in Chromium."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from devpool.report.html import OUTCOME_COLORS, render_html
from devpool.report.record import read_record
from docs_screenshots import keep_for_docs

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CHROMIUM = Path("/usr/bin/chromium")
T0 = 1_700_000_000.0

EVIL_ID = 'tests/test_web.py::test_page[<script>alert("x")</script>-a&b]'
PAIR_ID = "tests/test_comm.py::test_pair[ring]"


# ---- helpers ---------------------------------------------------------------------------------


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    parents: list[Element]
    text: str = ""
    children: list[Element] = field(default_factory=list)

    def has_class(self, name: str) -> bool:
        return name in self.attrs.get("class", "").split()

    def inside(self, name: str) -> Element | None:
        return next((p for p in reversed(self.parents) if p.has_class(name)), None)


class _Tree(HTMLParser):
    """Every element with its attributes (unescaped by the parser), ancestors and own text."""

    VOID = {"meta", "br", "hr", "img", "input", "link", "wbr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[Element] = []
        self.stack: list[Element] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs}, list(self.stack))
        if self.stack:
            self.stack[-1].children.append(element)
        self.elements.append(element)
        if tag not in self.VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if self.stack and self.stack[-1].tag == tag:
            self.stack.pop()

    def handle_endtag(self, tag: str) -> None:
        for index in range(len(self.stack) - 1, -1, -1):
            if self.stack[index].tag == tag:
                del self.stack[index:]
                return

    def handle_data(self, data: str) -> None:
        for element in self.stack:
            element.text += data


def parse(page: str) -> list[Element]:
    tree = _Tree()
    tree.feed(page)
    tree.close()
    return tree.elements


def with_class(elements: list[Element], name: str) -> list[Element]:
    return [e for e in elements if e.has_class(name)]


def bar_title(bar: Element) -> str:
    titles = [c for c in bar.children if c.tag == "title"]
    assert len(titles) == 1, bar.attrs
    return titles[0].text


def event(event_type: str, time: float, **fields: Any) -> dict[str, Any]:
    return {"v": 1, "type": event_type, "time": time, **fields}


def session_start(devices: list[int], tests: int) -> dict[str, Any]:
    return event(
        "session_start",
        T0,
        run_id="20231114-221320-42",
        host="box",
        pid=42,
        args=[],
        cwd="/tmp",
        platform="sim",
        kind="sim",
        devices=devices,
        options={},
        tests=tests,
    )


def job(
    number: int,
    nodeid: str,
    devices: list[int],
    start: float,
    end: float,
    outcome: str,
    *,
    attempt: int = 1,
    queue_wait: float = 0.0,
    detail: str = "",
    log: str = "",
    tail: list[str] | None = None,
) -> list[dict[str, Any]]:
    common = {"job": number, "nodeid": nodeid, "devices": devices, "host": "box"}
    common |= {"attempt": attempt, "queue_wait": queue_wait, "log": log}
    return [
        event("job_start", T0 + start, worker_pid=100 + number, **common),
        event(
            "job_end",
            T0 + end,
            outcome=outcome,
            start=T0 + start,
            end=T0 + end,
            run_time=end - start,
            detail=detail,
            tail=tail or [],
            **common,
        ),
    ]


def write_record(path: Path, events: list[dict[str, Any]], trailer: str = "") -> Path:
    # json.dumps' default ensure_ascii writes a lone surrogate as the escape "\udc80", as
    # a record can hold it; the reader gets it back as a lone surrogate.
    path.write_text("".join(json.dumps(e) + "\n" for e in events) + trailer, encoding="utf-8")
    return path


TAIL = [
    "E   assert page == '<script>document.cookie</script>'",
    "\x1b[31mFAILED\x1b[0m in \x1b[1;4mred\x1b[0m",
    "bytes: \ufffd\ufffd and a lone \udc80 surrogate",
    "carriage\rreturn & <b>bold</b>",
]


def finished_events() -> list[dict[str, Any]]:
    events = [session_start([0, 1, 2, 3], tests=6)]
    events += job(0, PAIR_ID, [0, 1], 0.5, 2.0, "passed", queue_wait=0.25)
    events += job(
        1,
        EVIL_ID,
        [2],
        0.5,
        1.0,
        "failed",
        detail="exit code 1 <oops>",
        log="/logs/test_page<1>.log",
        tail=TAIL,
    )
    events += job(2, "tests/test_cpu.py::test_a", [], 0.1, 1.1, "passed")
    events += job(3, "tests/test_cpu.py::test_b", [], 0.6, 1.6, "passed")  # overlaps test_a
    events += job(4, "tests/test_cpu.py::test_c", [], 1.2, 1.3, "skipped")  # fits lane 1
    events += job(5, "tests/test_slow.py::test_slow", [3], 0.2, 3.0, "timeout", detail="limit")
    events += job(6, "tests/test_x.py::test_flip", [2], 1.5, 1.8, "failed")
    events += job(6, "tests/test_x.py::test_flip", [2], 2.0, 2.2, "flaky", attempt=2)
    events.append(event("session_end", T0 + 3.5, exitstatus=1, troubles={}))
    return events


@pytest.fixture
def finished(tmp_path: Path) -> list[Element]:
    record = read_record(write_record(tmp_path / "r.jsonl", finished_events()))
    return parse(render_html(record))


# ---- unit: hand-built records ----------------------------------------------------------------


def test_one_row_per_device_and_cpu_jobs_stacked_into_lanes(finished: list[Element]) -> None:
    rows = with_class(finished, "device-row")
    assert [row.attrs["data-device"] for row in rows] == ["0", "1", "2", "3"]
    labels = [e.text for e in with_class(finished, "row-label")]
    assert labels[:4] == ["sim:0", "sim:1", "sim:2", "sim:3"]
    lanes = with_class(finished, "cpu-row")
    assert len(lanes) == 2  # test_a and test_b overlap; test_c fits after test_a
    # Lanes are room for bars, not CPU slots: only the first is named ("cpu 2" misled).
    assert [e.text for e in with_class(finished, "row-label") if e.inside("cpu-row")] == ["cpu", ""]
    lane_of = {
        bar.attrs["data-nodeid"]: bar.inside("cpu-row").attrs["data-lane"]  # type: ignore[union-attr]
        for bar in with_class(finished, "bar")
        if bar.inside("cpu-row") is not None
    }
    assert lane_of == {
        "tests/test_cpu.py::test_a": "0",
        "tests/test_cpu.py::test_b": "1",
        "tests/test_cpu.py::test_c": "0",
    }


def test_one_bar_per_attempt_on_each_device_it_held(finished: list[Element]) -> None:
    bars = with_class(finished, "bar")
    placed = sorted(
        (b.attrs["data-nodeid"], b.attrs.get("data-device", "cpu"), b.attrs["data-attempt"])
        for b in bars
    )
    assert placed == sorted(
        [
            (PAIR_ID, "0", "1"),
            (PAIR_ID, "1", "1"),
            (EVIL_ID, "2", "1"),
            ("tests/test_cpu.py::test_a", "cpu", "1"),
            ("tests/test_cpu.py::test_b", "cpu", "1"),
            ("tests/test_cpu.py::test_c", "cpu", "1"),
            ("tests/test_slow.py::test_slow", "3", "1"),
            ("tests/test_x.py::test_flip", "2", "1"),
            ("tests/test_x.py::test_flip", "2", "2"),
        ]
    )
    for bar in bars:
        row = bar.inside("device-row")
        if "data-device" in bar.attrs:
            assert row is not None and row.attrs["data-device"] == bar.attrs["data-device"]
        assert bar.has_class(f"outcome-{bar.attrs['data-outcome']}")
    by_outcome = {b.attrs["data-nodeid"]: b.attrs["data-outcome"] for b in bars}
    assert by_outcome["tests/test_slow.py::test_slow"] == "timeout"
    assert by_outcome["tests/test_cpu.py::test_c"] == "skipped"


def test_bar_position_follows_time_since_start(finished: list[Element]) -> None:
    def x_range(nodeid: str, attempt: str = "1") -> tuple[float, float]:
        bar = next(
            b
            for b in with_class(finished, "bar")
            if b.attrs["data-nodeid"] == nodeid and b.attrs["data-attempt"] == attempt
        )
        x = float(bar.attrs["x"])
        return x, x + float(bar.attrs["width"])

    slow = x_range("tests/test_slow.py::test_slow")
    pair = x_range(PAIR_ID)
    assert slow[0] < pair[0] < pair[1] < slow[1]
    # 2.8 s against 1.5 s: widths keep the proportion
    assert (slow[1] - slow[0]) / (pair[1] - pair[0]) == pytest.approx(2.8 / 1.5, rel=0.01)
    first, second = (
        x_range("tests/test_x.py::test_flip"),
        x_range("tests/test_x.py::test_flip", "2"),
    )
    assert first[1] < second[0]  # the idle gap between the attempts stays empty track
    ticks = [e.text for e in with_class(finished, "tick")]
    assert ticks[:3] == ["0 s", "0.5 s", "1 s"] and "3.5 s" in ticks


def test_tooltip_names_test_devices_duration_wait_attempt_outcome(finished: list[Element]) -> None:
    bar = next(b for b in with_class(finished, "bar") if b.attrs["data-nodeid"] == PAIR_ID)
    lines = bar_title(bar).splitlines()
    assert lines[0] == PAIR_ID
    for expected in (
        "devices: sim:0,1",
        "duration: 1.50 s",
        "queue wait: 0.25 s",
        "attempt: 1",
        "outcome: passed",
    ):
        assert expected in lines
    cpu = next(b for b in with_class(finished, "bar") if b.attrs["data-nodeid"].endswith("test_a"))
    assert "devices: cpu" in bar_title(cpu).splitlines()
    flaky = [b for b in with_class(finished, "bar") if b.attrs["data-attempt"] == "2"]
    assert "attempt: 2" in bar_title(flaky[0]) and "outcome: flaky" in bar_title(flaky[0])


def test_header_shows_run_platform_duration_and_totals(finished: list[Element]) -> None:
    text = next(e for e in finished if e.tag == "header").text
    assert "devpool run 20231114-221320-42" in text
    assert "sim:0-3 (4 devices)" in text
    assert "2023-11-14 22:13:20 UTC" in text
    assert "3.50 s" in text
    # The banner says what failed, not only that the run ended.
    assert "2 tests did not pass: 1 failed, 1 timeout (exit code 1)." in text
    (status,) = with_class(finished, "status")
    assert status.has_class("failing")  # exit status 1: not the green banner
    totals = {
        e.attrs["data-outcome"]: e.text for e in with_class(finished, "count") if e.inside("totals")
    }
    assert totals == {
        "passed": "3 passed",
        "failed": "1 failed",
        "timeout": "1 timeout",
        "skipped": "1 skipped",
        "flaky": "1 flaky",
    }
    legend = [e.text for e in finished if e.has_class("key")]
    assert legend[:3] == ["passed", "failed", "error"]


def test_table_lists_only_tests_that_did_not_pass(finished: list[Element]) -> None:
    rows = with_class(finished, "trouble")
    assert [r.attrs["data-nodeid"] for r in rows] == [EVIL_ID, "tests/test_slow.py::test_slow"]
    # The flaky test passed: listed apart, not counted among the tests that did not pass.
    assert [r.attrs["data-nodeid"] for r in with_class(finished, "flaky")] == [
        "tests/test_x.py::test_flip"
    ]
    evil = rows[0]
    assert "exit code 1 <oops>" in evil.text
    assert "/logs/test_page<1>.log" in evil.text
    assert "failed" in evil.text and "sim:2" in evil.text


def test_nodeids_and_tails_are_escaped_and_stripped(tmp_path: Path) -> None:
    record = read_record(write_record(tmp_path / "r.jsonl", finished_events()))
    page = render_html(record)
    page.encode("utf-8")  # no lone surrogate survives: the page can be written as UTF-8
    assert "<script" not in page.lower()
    assert "<b>" not in page
    assert "\x1b" not in page and "\r" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;-a&amp;b" in page

    elements = parse(page)
    assert not [e for e in elements if e.tag in ("script", "b")]
    evil_bars = [b for b in with_class(elements, "bar") if b.attrs["data-nodeid"] == EVIL_ID]
    assert len(evil_bars) == 1 and bar_title(evil_bars[0]).startswith(EVIL_ID + "\n")
    (tail,) = [e for e in elements if e.tag == "pre"]
    assert tail.has_class("tail")
    assert tail.text.splitlines() == [
        "E   assert page == '<script>document.cookie</script>'",
        "FAILED in red",
        "bytes: \ufffd\ufffd and a lone \ufffd surrogate",
        "carriagereturn & <b>bold</b>",
    ]


def test_cut_run_shows_the_cut_sentence_and_the_job_left_running(tmp_path: Path) -> None:
    events = [session_start([0, 1], tests=3)]
    events += job(0, "tests/test_a.py::test_done", [0], 0.0, 1.0, "passed")
    events.append(
        event(
            "job_start",
            T0 + 1.0,
            job=1,
            nodeid="tests/test_a.py::test_hangs",
            devices=[1],
            host="box",
            worker_pid=7,
            queue_wait=0.5,
            attempt=1,
            log="/logs/w.log",
        )
    )
    events.append(event("report", T0 + 4.0, nodeid="tests/test_a.py::test_done", when="call"))
    record = read_record(write_record(tmp_path / "r.jsonl", events))
    cut = record.cut_sentence()
    assert cut is not None and "1 of 3 tests ran" in cut

    elements = parse(render_html(record))
    status = with_class(elements, "status")
    assert [s.text for s in status] == [cut[0].upper() + cut[1:] + "."]
    assert status[0].has_class("cut")
    hanging = [b for b in with_class(elements, "bar") if b.attrs["data-outcome"] == "running"]
    assert len(hanging) == 1 and hanging[0].attrs["data-device"] == "1"
    assert "still running when the run was cut" in bar_title(hanging[0])
    assert "duration: 3.00 s" in bar_title(hanging[0])  # to the last line the record has
    assert not with_class(elements, "trouble")
    (interrupted,) = with_class(elements, "interrupted")
    assert "tests/test_a.py::test_hangs" in interrupted.text
    totals = [e.text for e in with_class(elements, "count") if e.inside("totals")]
    assert totals == ["1 passed", "1 interrupted", "1 not run"]


def test_damaged_record_shows_the_damage_sentence(tmp_path: Path) -> None:
    events = [session_start([0], tests=2)]
    events += job(0, "tests/test_a.py::test_one", [0], 0.0, 1.0, "passed")
    path = write_record(tmp_path / "r.jsonl", events, trailer='{"v": 1, "type": "job_st')
    record = read_record(path)
    assert record.damage is not None
    elements = parse(render_html(record))
    damage = with_class(elements, "damage")
    assert [d.text for d in damage] == [record.damage]
    assert len(with_class(elements, "bar")) == 1


# ---- end to end: the demo suite, rendered, in real Chromium -----------------------------------


@pytest.fixture(scope="module")
def demo_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo suite run for real on eight simulated devices, rendered to an HTML file."""
    work = tmp_path_factory.mktemp("demo")
    record_path = work / "r.jsonl"
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(EXAMPLES),
        "--devices",
        "sim:0-7",
        f"--devpool-lock-dir={work / 'locks'}",
        f"--devpool-run-dir={work / 'run'}",
        f"--devpool-run-record={record_path}",
        "-p",
        "no:cacheprovider",
        "-q",
    ]
    done = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    page = work / "report.html"
    page.write_text(render_html(read_record(record_path)), encoding="utf-8")
    return page


def test_demo_run_renders_every_device_and_every_test(demo_page: Path) -> None:
    elements = parse(demo_page.read_text(encoding="utf-8"))
    rows = with_class(elements, "device-row")
    assert [r.attrs["data-device"] for r in rows] == [str(d) for d in range(8)]
    record = read_record(demo_page.parent / "r.jsonl")
    bars = with_class(elements, "bar")
    assert len(bars) == sum(max(len(j.devices), 1) for j in record.jobs)
    assert {b.attrs["data-nodeid"] for b in bars} == {j.nodeid for j in record.jobs}


@pytest.fixture
def chromium(tmp_path: Path) -> list[str]:
    """The headless Chromium command line; skipped only off CI when Chromium is missing."""
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing on CI; .ci/run installs it")
        pytest.skip(f"{CHROMIUM} is not installed")
    return [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]


def test_chromium_screenshot_shows_passed_bars(
    chromium: list[str], demo_page: Path, tmp_path: Path
) -> None:
    shot = tmp_path / "t.png"
    done = subprocess.run(
        [*chromium, f"--screenshot={shot}", "--window-size=1400,900", demo_page.as_uri()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shot.exists(), done.stderr[-3000:]
    width, height, pixels = decode_png(shot.read_bytes())
    assert (width, height) == (1400, 900)
    green = _rgb(OUTCOME_COLORS["passed"])
    matches = sum(1 for p in pixels if all(abs(a - b) <= 3 for a, b in zip(p, green, strict=True)))
    assert matches > 2000  # eight rows of bars, not a stray pixel
    assert len(set(pixels)) > 20  # text, tracks, legend: not a blank page
    keep_for_docs(shot, "report.png")  # docs/reports.md shows it


def test_chromium_dom_has_eight_device_rows_each_with_bars(
    chromium: list[str], demo_page: Path
) -> None:
    done = subprocess.run(
        [*chromium, "--dump-dom", demo_page.as_uri()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    elements = parse(done.stdout)
    rows = with_class(elements, "device-row")
    assert len(rows) == 8
    for row in rows:
        bars = [e for e in with_class(elements, "bar") if e.inside("device-row") is row]
        assert bars, f"no bar in row {row.attrs}"
        assert all(b.attrs["data-device"] == row.attrs["data-device"] for b in bars)


def _rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def decode_png(data: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Width, height and RGB pixels of an 8-bit, non-interlaced RGB or RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, idat = 8, b""
    width = height = channels = 0
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind = data[position + 4 : position + 8]
        body = data[position + 8 : position + 8 + length]
        position += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    raw = zlib.decompress(idat)
    stride = width * channels
    previous = bytearray(stride)
    pixels: list[tuple[int, int, int]] = []
    for row in range(height):
        start = row * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                guess = left + up - corner
                pa, pb, pc = abs(guess - left), abs(guess - up), abs(guess - corner)
                best = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + best) & 0xFF
        pixels.extend((line[i], line[i + 1], line[i + 2]) for i in range(0, stride, channels))
        previous = line
    return width, height, pixels
