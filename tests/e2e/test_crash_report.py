"""End to end: a CRASHED report shows the crashing frame and folds the rest (issue 39, 2.4).

A test whose thread segfaults: faulthandler dumps the main thread's ~50 frames of pytest
after the crashing thread, so the last 60 lines of the worker's output began inside the
main thread's frames and left out the crash. The report now holds the whole dump, folded.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

FAST = ("-p", "no:hypothesispytest", "-p", "no:cacheprovider", "-p", "no:randomly")

CRASH = """
import faulthandler
import threading

import pytest


def crash_here():
    faulthandler._sigsegv()


@pytest.mark.device_count(1)
def test_crashes_in_a_thread():
    thread = threading.Thread(target=crash_here)
    thread.start()
    thread.join(30)
"""


def test_a_crash_report_shows_the_crashing_frame_and_folds_pytest_s(tmp_path: Path) -> None:
    (tmp_path / "test_crash.py").write_text(CRASH)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "DEVPOOL_"))}
    env.pop("CI", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *FAST, "test_crash.py", "--devices", "sim:0-1",
         f"--devpool-lock-dir={tmp_path / 'locks'}", "--devpool-reruns-infra=0"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 1 and "1 crashed" in out.splitlines()[-1], out + done.stderr
    report = out[out.index("[devpool] CRASHED:") : out.index("devpool: 1 test did not pass")]
    shown = report.splitlines()
    assert shown[1] == "---- worker output during this test (tail) ----", report
    assert shown[2] == "Fatal Python error: Segmentation fault", report  # the dump from its top
    crash = next(i for i, line in enumerate(shown) if line.endswith(" in crash_here"))
    assert shown[crash + 1].strip() == "faulthandler._sigsegv()", report
    assert shown[crash - 1].startswith("Current thread 0x"), report
    assert re.search(r"^  \(\d+ frames of pytest, pluggy and devpool\)$", report, re.M), report
    assert "/_pytest/" not in report and "/pluggy/" not in report, report  # folded
