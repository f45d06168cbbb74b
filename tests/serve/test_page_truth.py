"""The host page tells what a real run did (issue 39, 2.7): its failures by outcome, the
failing tests' logs among the few a recent run links, and a waiting run's own devices
never among those "held by others"."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from devpool.devices.leases import Holder, Lease
from devpool.devices.lockdir import LockDir
from devpool.serve import device_views, pages, views

FAST = ("-p", "no:hypothesispytest", "-p", "no:cacheprovider", "-p", "no:randomly")

SUITE = """
import os
import time

import pytest


@pytest.mark.parametrize("i", range(6))
@pytest.mark.device_count(1)
def test_passes(i):
    pass


@pytest.mark.device_count(1)
def test_fails():
    assert 1 == 2


@pytest.mark.device_count(1)
def test_crashes():
    os._exit(3)


@pytest.mark.timeout(1)
def test_times_out():
    time.sleep(30)
"""


def test_a_finished_run_s_row_names_its_endings_and_links_its_failures_logs(
    tmp_path: Path,
) -> None:
    (tmp_path / "z_suite.py").write_text(SUITE)  # its logs sort after the workers
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "DEVPOOL_"))}
    env.pop("CI", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *FAST, "z_suite.py", "--devices", "sim:0-3",
         f"--devpool-lock-dir={tmp_path / 'locks'}", "--devpool-reruns-infra=0"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    closing = done.stdout.strip().splitlines()[-1]
    bad = {"failed", "error", "timeout", "crashed", "infra"}
    said = {p for p in re.findall(r"\d+ \w+", closing.split(" in ")[0]) if p.split()[1] in bad}
    assert said == {"1 failed", "1 crashed", "1 timeout"}, closing

    summaries = views.RunIndex(views.projects_of([tmp_path / ".devpool"])).summaries()
    (run,) = views.runs_view(summaries, live=False)["runs"]
    live = pages.live_section({"runs": [run]}, time.time())
    cell = re.search(r'#failures">([^<]*)</a>', live)
    assert cell and set(cell.group(1).split(", ")) == said, live  # as the closing line

    recent = pages.recent_section({"runs": [run]})
    linked = re.findall(r'href="[^"]*/files/logs/([^"]+)"', recent)
    failing = {Path(f["log"]).name for f in run["failures"]}
    assert len(failing) == 3 and failing <= set(linked), (failing, linked)
    by_name = {href.rsplit("/", 1)[-1] for href in run["logs"][: pages.SHOWN_LOGS]}
    assert not failing <= by_name, "the first logs by name hold them: this proves nothing"
    assert len(run["logs"]) > pages.SHOWN_LOGS, run["logs"]  # more logs than the row shows
    assert len(linked) == pages.SHOWN_LOGS and "more</a>" in recent, recent


def test_a_waiting_run_s_own_devices_are_not_held_by_others(tmp_path: Path) -> None:
    locks = LockDir(tmp_path / "locks")
    waiting = locks.path / "waiting"
    waiting.mkdir()
    waiter = {"session": "run-w", "pid": os.getpid(), "host": os.uname().nodename,
              "platform": "sim", "since": time.time() - 3, "wants": 4}  # fmt: skip
    (waiting / "run-w.json").write_text(json.dumps(waiter))
    own = locks.try_acquire("sim", [0], Holder.for_this_process("run-w", "t::small"))
    other = locks.try_acquire("sim", [1, 2], Holder.for_this_process("run-h", "t::pair"))
    assert isinstance(own, Lease) and isinstance(other, Lease)
    try:
        states = device_views.lock_states(locks.path)
        view = device_views.waiting_view(device_views.waiters(locks.path), states)
    finally:
        own.release()
        other.release()
    (row,) = view["waiting"]
    assert row["busy"] == ["sim:1", "sim:2"], row
    page = pages.waiting_section(view, {}, time.time())
    assert "sim:1, sim:2" in page and "sim:0" not in page, page


def test_held_and_free_devices_take_one_width_and_eight_fit_a_1400_px_row(
    tmp_path: Path, browser: Any
) -> None:
    """A held tile with a long test id wraps it inside the tile: it is as wide as a free one,
    so eight devices, half of them held, stand in one row of a 1400 px page."""
    locks = LockDir(tmp_path / "locks")
    test = "tests/models/test_attention.py::test_flash_attention_matches_reference[bf16-seq4096]"
    held = [
        locks.try_acquire("sim", [device], Holder.for_this_process("run-h", f"{test}-{device}"))
        for device in range(4)
    ]
    assert all(isinstance(lease, Lease) for lease in held)
    try:
        states = device_views.lock_states(locks.path)
    finally:
        for lease in held:
            assert isinstance(lease, Lease)
            lease.release()
    # sim:4-7 are in a live run's inventory, with no lock file yet: free
    view = device_views.devices_view(states, locks.path, known=[("sim", d) for d in range(8)])
    html = pages.document("devpool", pages.devices_section(view, {}, time.time()), live=False)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_content(html)
    boxes = page.evaluate(
        "Array.from(document.querySelectorAll('.device')).map(e => {"
        "const r = e.getBoundingClientRect();"
        "return [e.dataset.state, Math.round(r.top), Math.round(r.width)]})"
    )
    assert [state for state, _, _ in boxes] == ["held"] * 4 + ["free"] * 4, boxes
    assert len({top for _, top, _ in boxes}) == 1, boxes  # one row
    assert len({width for _, _, width in boxes}) == 1, boxes  # one width
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400
