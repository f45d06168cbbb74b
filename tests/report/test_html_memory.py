"""The HTML report's memory lanes: hand-built records, then a real sim run in Chromium."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from devpool.report.html import render_html
from devpool.report.memory_lane import LANE_HEIGHT
from devpool.report.record import read_record

T0 = 1_700_000_000.0
GiB = 2**30
CHROMIUM = Path("/usr/bin/chromium")


class _Rects(HTMLParser):
    """Every element's tag and attributes, in document order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, {k: v or "" for k, v in attrs}))


def elements(page: str, name: str) -> list[dict[str, str]]:
    parser = _Rects()
    parser.feed(page)
    # <i> elements are the legend's swatches, not data.
    return [a for t, a in parser.found if t != "i" and name in a.get("class", "").split()]


def event(event_type: str, time: float, **fields: Any) -> dict[str, Any]:
    return {"v": 1, "type": event_type, "time": time, **fields}


def job(number: int, nodeid: str, device: int, start: float, end: float, **end_fields: Any):
    common = {"job": number, "nodeid": nodeid, "devices": [device], "host": "box", "attempt": 1}
    return [
        event("job_start", T0 + start, **common),
        event("job_end", T0 + end, outcome="passed", start=T0 + start, end=T0 + end, **common)
        | end_fields,
    ]


def record(tmp_path: Path, *jobs: list[dict[str, Any]], memory: Any = None) -> str:
    start = {"run_id": "r", "host": "box", "platform": "sim", "kind": "sim", "devices": [0, 1]}
    start |= {"tests": len(jobs), "args": [], "cwd": "/", "pid": 1, "options": {}}
    if memory is not None:
        start["memory"] = memory
    events = [event("session_start", T0, **start)]
    for pair in jobs:
        events += pair
    events.append(event("session_end", T0 + 10, exitstatus=0, troubles={}))
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return render_html(read_record(path))


def test_a_lane_per_device_with_each_hold_stacked_at_its_declared_size(tmp_path: Path) -> None:
    page = record(
        tmp_path,
        job(0, "t.py::a", 0, 0.0, 4.0, memory=4 * GiB, memory_peak={"0": 3 * GiB}),
        job(1, "t.py::b", 0, 2.0, 6.0, memory=2 * GiB, memory_peak={"0": 3 * GiB}),  # overran
        job(2, "t.py::whole", 1, 0.0, 5.0),  # a whole-device test: no lane of its own
        memory={"0": 8 * GiB, "1": 8 * GiB},
    )
    lanes = elements(page, "memory-lane")
    assert [(lane["data-device"], lane["data-capacity"]) for lane in lanes] == [("0", str(8 * GiB))]
    assert lanes[0]["data-max-held"] == str(6 * GiB)
    holds = elements(page, "memory-hold")
    # a alone [0, 2), a and b [2, 4), b alone [4, 6): four bands, b stacked on top of a.
    assert [(h["data-nodeid"], float(h["x"])) for h in holds] == [
        ("t.py::a", 96.0),
        ("t.py::a", pytest.approx(96 + 2 * 118)),
        ("t.py::b", pytest.approx(96 + 2 * 118)),
        ("t.py::b", pytest.approx(96 + 4 * 118)),
    ]
    unit = (LANE_HEIGHT - 4) / (8 * GiB)
    assert float(holds[0]["height"]) == pytest.approx(4 * GiB * unit, abs=0.01)
    assert float(holds[2]["y"]) + float(holds[2]["height"]) == pytest.approx(
        float(holds[1]["y"]), abs=0.01
    )  # b sits on a
    peaks = elements(page, "memory-peak")
    assert {p["data-nodeid"]: p["data-peak"] for p in peaks} == {
        "t.py::a": str(3 * GiB),
        "t.py::b": str(3 * GiB),
    }
    over = elements(page, "over")
    assert {p["data-nodeid"] for p in over} == {"t.py::b"}  # more than its 2 GiB
    assert "peak: 3 GiB (more than declared)" in page
    assert "8 GiB of 8 GiB" not in page and "6 GiB of 8 GiB" in page  # the note's title
    assert ">6 GiB</text>" in page and ">of 8 GiB</text>" in page  # two short lines


def test_no_memory_test_no_memory_section(tmp_path: Path) -> None:
    page = record(tmp_path, job(0, "t.py::whole", 1, 0.0, 5.0))
    assert "Device memory" not in page
    assert not elements(page, "memory-lane")


def test_without_capacity_the_lane_scales_to_the_most_held_and_peaks_alone_draw(
    tmp_path: Path,
) -> None:
    page = record(
        tmp_path,
        job(0, 't.py::a[<b>"x"</b>]', 1, 0.0, 4.0, memory=2 * GiB),
        job(1, "t.py::old", 1, 0.0, 4.0, memory_peak={"1": GiB}),  # an older record: no memory
    )
    (lane,) = elements(page, "memory-lane")
    assert lane["data-capacity"] == "" and lane["data-max-held"] == str(3 * GiB)
    assert "3 GiB max held" in page
    assert {h["data-nodeid"] for h in elements(page, "memory-hold")} == {
        't.py::a[<b>"x"</b>]',
        "t.py::old",
    }
    assert "t.py::a[&lt;b&gt;&quot;x&quot;&lt;/b&gt;]" in page  # escaped, not markup


# ---- a real run on sim devices -----------------------------------------------------------------

SUITE = """
import json, os, time
from pathlib import Path
import pytest

@pytest.mark.device_memory("3GiB")
@pytest.mark.parametrize("n", range(4))
def test_small(n):
    Path(os.environ["DEVPOOL_SIM_MEMORY_FILE"]).write_text(json.dumps(2**30 * (1 + n % 2)))
    time.sleep(0.3)

@pytest.mark.device_count(1)
def test_whole():
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def memory_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("memory")
    (work / "pyproject.toml").write_text('[tool.devpool.platforms]\nsim = { memory = "8GiB" }\n')
    (work / "test_mem.py").write_text(textwrap.dedent(SUITE))
    record_path = work / "r.jsonl"
    command = [sys.executable, "-m", "pytest", "test_mem.py", "--devices", "sim:0-1"]
    command += [f"--devpool-lock-dir={work / 'locks'}", f"--devpool-run-record={record_path}"]
    command += ["--devpool-memory-reserve=0", "-p", "no:cacheprovider", "-p", "no:randomly"]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEVPOOL_")}
    done = subprocess.run(
        command, cwd=work, env=environ, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    page = work / "report.html"
    page.write_text(render_html(read_record(record_path)), encoding="utf-8")
    return page


def test_real_run_draws_every_memory_test_with_its_declaration_and_peak(memory_page: Path) -> None:
    page = memory_page.read_text(encoding="utf-8")
    holds = elements(page, "memory-hold")
    assert {h["data-nodeid"] for h in holds} == {f"test_mem.py::test_small[{n}]" for n in range(4)}
    assert {h["data-declared"] for h in holds} == {str(3 * GiB)}
    peaks = {p["data-nodeid"]: int(p["data-peak"]) for p in elements(page, "memory-peak")}
    assert peaks == {f"test_mem.py::test_small[{n}]": GiB * (1 + n % 2) for n in range(4)}
    for lane in elements(page, "memory-lane"):
        assert int(lane["data-max-held"]) <= 8 * GiB  # never more than a device holds


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
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]


def test_chromium_lays_out_the_memory_lanes(chromium: list[str], memory_page: Path) -> None:
    done = subprocess.run(
        [*chromium, "--dump-dom", memory_page.as_uri()], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lanes = elements(done.stdout, "memory-lane")
    assert lanes and all(lane["data-device"] in ("0", "1") for lane in lanes)
    assert len(elements(done.stdout, "memory-hold")) >= 4


def test_chromium_paints_the_peak_bands(
    chromium: list[str], memory_page: Path, tmp_path: Path
) -> None:
    from test_html_report import decode_png  # the PNG reader of the timeline's own tests

    shot = tmp_path / "m.png"
    subprocess.run(
        [*chromium, f"--screenshot={shot}", "--window-size=1400,900", memory_page.as_uri()],
        capture_output=True,
        timeout=60,
    )
    assert shot.exists()
    _, _, pixels = decode_png(shot.read_bytes())
    peak = (0x09, 0x69, 0xDA)  # .memory-peak
    assert sum(1 for p in pixels if all(abs(a - b) <= 3 for a, b in zip(p, peak, strict=True))) > 50
