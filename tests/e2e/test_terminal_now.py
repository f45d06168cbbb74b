"""End to end: a terminal that shows what runs now (issue 29, item 3).

Real sessions on sim devices: `-v` lines name the devices as xdist's name the worker; a test
running past --devpool-slow-timeout gets SLOW lines at each multiple; a crash with no output
has no empty output header; one live status line on a terminal (a pseudo-terminal here),
none under CI=true, when piped or with -qq.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

FAST = ("-p", "no:hypothesispytest", "-p", "no:cacheprovider", "-p", "no:randomly")

SUITE = """
import os
import time

import pytest


@pytest.mark.device_count(2)
def test_pair():
    pass


def test_cpu():
    pass


@pytest.mark.device_count(1)
def test_slow():
    time.sleep(2.6)


@pytest.mark.device_count(1)
def test_silent_crash():
    os._exit(3)
"""


def environ(**extra: str) -> dict[str, str]:
    drop = ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "DEVPOOL_SUMMARY_BY_PARENT", "CI")
    base = {k: v for k, v in os.environ.items() if k not in drop}
    return {**base, **extra}


def argv(tmp_path: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        *FAST,
        "test_suite.py",
        "--devices",
        "sim:0-3",
        f"--devpool-lock-dir={tmp_path / 'locks'}",
        "--devpool-reruns-infra=0",
        *args,
    ]


def test_verbose_lines_name_devices_slow_lines_and_no_empty_output_header(tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(SUITE)
    done = subprocess.run(
        argv(tmp_path, "-v", "--devpool-slow-timeout=1"),
        cwd=tmp_path,
        env=environ(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert re.search(r"^\[sim:\d,\d\] \[ *\d+%\] PASSED test_suite.py::test_pair", out, re.M), out
    assert re.search(r"^\[cpu\] \[ *\d+%\] PASSED test_suite.py::test_cpu", out, re.M), out
    assert re.search(r"^\[sim:\d\] \[ *\d+%\] CRASHED test_suite.py::test_silent_crash", out, re.M)

    slow = [int(s) for s in re.findall(r"^SLOW \[> (\d+)s\] test_suite.py::test_slow$", out, re.M)]
    assert slow and slow == sorted(set(slow)) and slow[-1] >= 2, out  # again at each multiple
    assert not re.search(r"^SLOW .*test_(pair|cpu)", out, re.M)
    # A worker that died saying nothing: no header over an empty tail.
    assert "worker output during this test" not in out, out


def test_no_slow_lines_under_the_default_limit(tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(SUITE)
    done = subprocess.run(
        argv(tmp_path, "-k", "slow"), cwd=tmp_path, env=environ(), capture_output=True, text=True
    )
    assert done.returncode == 0 and "SLOW" not in done.stdout, done.stdout


def on_a_terminal(tmp_path: Path, *args: str, **env: str) -> str:
    """Run a session with its output on a pseudo-terminal; everything it wrote there."""
    main, secondary = pty.openpty()
    process = subprocess.Popen(
        argv(tmp_path, "-k", "slow or cpu", *args),
        cwd=tmp_path,
        env=environ(COLUMNS="200", **env),
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    chunks = []
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline, b"".join(chunks)
        try:
            data = os.read(main, 65536)
        except OSError:  # the session ended and closed its side
            break
        if not data:
            break
        chunks.append(data)
    os.close(main)
    assert process.wait(timeout=60) == 0, b"".join(chunks)
    return b"".join(chunks).decode("utf-8", "replace")


def test_one_live_status_line_on_a_terminal_only(tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(SUITE)
    shown = on_a_terminal(tmp_path)
    status = re.findall(
        r"devpool: running 1: test_suite.py::test_slow \d+s \[sim:\d\][^\r\n]*", shown
    )
    assert status, shown
    assert "queued 0" in status[-1] and "devices 1/4 busy" in status[-1]
    assert "devpool: running" not in on_a_terminal(tmp_path, CI="true")
    assert "devpool: running" not in on_a_terminal(tmp_path, "-qq")
    assert "devpool: running" in on_a_terminal(tmp_path, "-q")
