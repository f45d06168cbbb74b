"""The HTML timeline of a real 200-test run, laid out by headless Chromium: every test's bar
is visible (nothing covers its middle), has a readable height, draws the test's own time
with start-up apart, and every test can be found in the page's text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_html_report import CHROMIUM, chromium, parse, with_class  # noqa: F401

from devpool.report.html import BAR_HEIGHT, MIN_BAR_WIDTH, PLOT_WIDTH, render_html
from devpool.report.record import read_record

SUITE = """
import time

import pytest


@pytest.mark.parametrize("i", range(150))
def test_cpu(i):
    if i % 50 == 7:
        pytest.skip("not here")


@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(46))
def test_device(i):
    time.sleep(0.01)


@pytest.mark.device_count(2)
@pytest.mark.parametrize("i", range(4))
def test_pair(i):
    time.sleep(0.05)
"""

# Run by Chromium after layout: for each bar, whether the element at its middle is the bar.
CHECK = """
<script>
window.addEventListener("load", () => {
  const seen = [];
  for (const bar of document.querySelectorAll("rect.bar")) {
    const box = bar.getBoundingClientRect();
    const hit = document.elementFromPoint(box.left + box.width / 2, box.top + box.height / 2);
    seen.push({nodeid: bar.dataset.nodeid, width: box.width, height: box.height,
               visible: hit === bar});
  }
  const out = document.createElement("pre");
  out.id = "layout-check";
  out.textContent = JSON.stringify(seen);
  document.body.appendChild(out);
});
</script>
"""


@pytest.fixture(scope="module")
def run_of_200(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("two-hundred")
    (work / "test_many.py").write_text(SUITE, encoding="utf-8")
    record = work / "r.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "test_many.py", "-q", "-p", "no:cacheprovider"]
        + ["-p", "no:randomly", "--devices", "sim:0-3", f"--devpool-lock-dir={work / 'locks'}"]
        + [f"--devpool-run-dir={work / 'run'}", f"--devpool-run-record={record}"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return record


def test_every_test_of_a_200_test_run_is_visible_and_findable(
    chromium: list[str],  # noqa: F811
    run_of_200: Path,
    tmp_path: Path,
) -> None:
    record = read_record(run_of_200)
    page = render_html(record)
    planned = [str(nodeid) for nodeid in record.start["planned"]]
    assert len(planned) == 200

    # Findable: every test is text in the page, and its bar links to its row.
    elements = parse(page)
    rows = {e.attrs["id"]: e.text for e in with_class(elements, "test")}
    texts = " ".join(rows.values())
    assert all(nodeid in texts for nodeid in planned)
    for bar in with_class(elements, "bar"):
        link = bar.parents[-1]
        assert link.tag == "a", link
        assert bar.attrs["data-nodeid"] in rows[link.attrs["href"].removeprefix("#")]

    # Visible, in Chromium's own layout.
    checked = tmp_path / "checked.html"
    checked.write_text(page.replace("</body>", CHECK + "</body>"), encoding="utf-8")
    done = subprocess.run(
        [*chromium, "--window-size=1400,4000", "--virtual-time-budget=5000", "--dump-dom"]
        + [checked.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = [e for e in parse(done.stdout) if e.attrs.get("id") == "layout-check"]
    assert found, done.stdout[-2000:]
    bars = json.loads(found[0].text)
    assert {bar["nodeid"] for bar in bars} == set(planned)
    hidden = [bar for bar in bars if not bar["visible"]]
    assert not hidden, hidden[:5]
    assert all(bar["width"] >= MIN_BAR_WIDTH - 0.01 for bar in bars)
    assert all(bar["height"] >= BAR_HEIGHT - 0.01 for bar in bars)

    # A screenshot to look at (kept beside the page when the test fails).
    shot = tmp_path / "timeline.png"
    subprocess.run(
        [*chromium, f"--screenshot={shot}", "--window-size=1400,1400", checked.as_uri()],
        capture_output=True,
        timeout=120,
    )
    assert shot.exists()


def test_bars_draw_the_tests_own_time_and_mark_start_up_apart(run_of_200: Path) -> None:
    record = read_record(run_of_200)
    elements = parse(render_html(record))
    first = {job.nodeid: job for job in reversed(record.jobs)}
    startups = with_class(elements, "startup")
    assert startups, "no start-up marked, though workers started"
    for bar in with_class(elements, "bar"):
        job = first[bar.attrs["data-nodeid"]]
        drawn = float(bar.attrs["width"])
        whole = job.run_time * PLOT_WIDTH / max(record.duration(), 1e-3)
        assert drawn <= max(whole, MIN_BAR_WIDTH) + 0.01
