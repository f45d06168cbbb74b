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


def on_a_terminal(
    tmp_path: Path, *args: str, select: str = "slow or cpu", columns: int = 200, **env: str
) -> str:
    """Run a session with its output on a pseudo-terminal; everything it wrote there."""
    main, secondary = pty.openpty()
    process = subprocess.Popen(
        argv(tmp_path, "-k", select, *args),
        cwd=tmp_path,
        env=environ(COLUMNS=str(columns), **env),
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
        r"devpool: done [^\r\n]*running 1: test_suite.py::test_slow \d+s \[sim:\d\]", shown
    )
    assert status, shown
    assert "queued 0" in status[-1] and "devices 1/4 busy" in status[-1]
    assert "devpool: done" not in on_a_terminal(tmp_path, CI="true")
    assert "devpool: done" not in on_a_terminal(tmp_path, "-qq")
    assert "devpool: done" in on_a_terminal(tmp_path, "-q")


LETTERS = """
import time

import pytest


@pytest.mark.parametrize("i", range(6))
def test_quick(i):
    pass


@pytest.fixture
def slow_teardown():
    yield
    time.sleep(1.5)  # its call has passed; the test is not done until this ends


@pytest.mark.device_count(1)
def test_slow(slow_teardown):
    time.sleep(2.6)
"""


def progress_lines(out: str) -> list[str]:
    """The lines between `collected` and the first line after the progress letters."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("collected ")) + 1
    return [line for line in lines[start:] if line and not line.startswith("devpool: run record")]


def test_slow_lines_stand_on_their_own_and_every_letter_line_ends_as_plain_pytest_s(
    tmp_path: Path,
) -> None:
    """Without -v a SLOW line is not glued to the letters: the letters before it end their
    line with the percentage, where plain pytest puts it on the same suite (issue 39, 2.1)."""
    (tmp_path / "test_suite.py").write_text(LETTERS)
    done = subprocess.run(
        argv(tmp_path, "--devpool-slow-timeout=1"),
        cwd=tmp_path,
        env=environ(COLUMNS="80"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    plain = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:devpool", *FAST, "test_suite.py"],
        cwd=tmp_path,
        env=environ(COLUMNS="80"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode == 0, plain.stdout
    (plain_line,) = [line for line in plain.stdout.splitlines() if line.endswith("[100%]")]
    edge = len(plain_line)  # where plain pytest ends a line of letters with its percentage
    shown = progress_lines(done.stdout)
    slow = [line for line in shown if "SLOW" in line]
    assert slow and all(line.startswith("SLOW [> ") for line in slow), done.stdout
    letters = [line for line in shown[: shown.index(slow[-1]) + 2] if "SLOW" not in line]
    assert letters, done.stdout
    for line in letters:
        assert re.fullmatch(r"[.]+ +\[ *\d+%\]", line) and len(line) == edge, done.stdout
    assert sum(len(line.split()[0]) for line in letters) == 7, done.stdout  # each test once


COUNTED = """
import time

import pytest


def test_quick():
    pass


@pytest.mark.xfail(reason="known")
def test_known():
    assert False


@pytest.fixture
def slow_teardown():
    yield
    time.sleep(1.5)  # its call has passed; the test is not done until this ends


@pytest.mark.device_count(1)
def test_slow(slow_teardown):
    time.sleep(2.6)
"""


def test_the_live_line_puts_its_counts_first_in_pytest_s_words(tmp_path: Path) -> None:
    """At 80 columns the live line still shows done, queued and busy (the running tests'
    names come after them), and it counts the tests done as plain pytest's closing line
    does: an xfail as xfailed, not skipped (issue 39, 2.5)."""
    (tmp_path / "test_suite.py").write_text(COUNTED)
    shown = on_a_terminal(tmp_path, select="quick or known or slow", columns=80)
    quick = ("test_suite.py", "-k", "not slow")
    plain = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:devpool", *FAST, *quick],
        cwd=tmp_path,
        env=environ(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    words = re.search(r"=+ (\d+ \w+(?:, \d+ \w+)*) in [\d.]+s", plain.stdout)
    assert words, plain.stdout
    statuses = re.findall(r"devpool: done [^\r\n\x1b]*", shown)
    assert statuses, shown
    last = statuses[-1]
    assert re.match(r"devpool: done \d+ .*· queued \d+ · devices \d+/4 busy", last), statuses
    while_slow = [line for line in statuses if line.startswith("devpool: done 2 (")]
    assert while_slow, statuses
    counts = re.match(r"devpool: done 2 \(([^)]*)\)", while_slow[-1])
    assert counts, while_slow
    # plain's deselected slow test and its unknown-mark warning are no test's outcome
    outcomes = {part for part in words.group(1).split(", ") if "deselected" not in part}
    outcomes = {part for part in outcomes if not re.fullmatch(r"\d+ warnings?", part)}
    assert set(counts.group(1).split(", ")) == outcomes, (while_slow, words.group(1))
    # the counts move with done, when a test ends: never a call passed before its teardown
    for line in statuses:
        done = re.match(r"devpool: done (\d+)(?: \(([^)]*)\))?", line)
        assert done, line
        told = sum(int(part.split()[0]) for part in (done.group(2) or "").split(", ") if part)
        assert told == int(done.group(1)), statuses


PRINTS = """
import pytest


@pytest.mark.device_count(1)
def test_prints():
    print("printed-by-the-test")
"""


def test_with_s_the_header_says_in_one_line_where_a_test_s_output_goes(tmp_path: Path) -> None:
    """Under -s plain pytest prints a test's output here; devpool's tests print in workers,
    so the header says in one line where it goes, and it is there (issue 39, 2.3)."""
    (tmp_path / "test_suite.py").write_text(PRINTS)
    done = subprocess.run(
        argv(tmp_path, "-s"),
        cwd=tmp_path,
        env=environ(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    said = [line for line in done.stdout.splitlines() if line.startswith("devpool: -s:")]
    assert len(said) == 1, done.stdout
    where = re.search(r"not here: (\S+)/worker-N\.log", said[0])
    assert where, said
    logs = Path(where.group(1)).glob("worker-*.log")
    assert any("printed-by-the-test" in log.read_text() for log in logs), said
    quiet = subprocess.run(
        argv(tmp_path), cwd=tmp_path, env=environ(), capture_output=True, text=True, timeout=120
    )
    assert quiet.returncode == 0 and "devpool: -s:" not in quiet.stdout, quiet.stdout
