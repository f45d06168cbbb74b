"""End to end: `devpool report` never misstates a run (issue 21, item 5).

Real sessions on sim devices: pytest's own categories (xfailed, xpassed) in every form of
the report, with plain pytest's closing line on the same suite as the oracle; an
interrupted run says so and names what did not run; utilisation keeps lease time and
test time apart; `--html` into a missing folder.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

FAST = ("-p", "no:hypothesispytest", "-p", "no:cacheprovider", "-p", "no:randomly")
DEVPOOL = (sys.executable, "-m", "devpool.cli")

CATEGORIES = """
import pytest


@pytest.mark.device_count(1)
def test_pass():
    pass


@pytest.mark.xfail(reason="known bug")
def test_xfail():
    assert 0


@pytest.mark.device_count(1)
@pytest.mark.xfail(reason="fixed since")
def test_xpass():
    pass


@pytest.mark.skip(reason="not here")
def test_skip():
    pass


@pytest.mark.device_count(1)
def test_fail():
    assert 1 == 2
"""

BLOCKING = """
import pathlib
import time

import pytest

HERE = pathlib.Path(__file__).parent


@pytest.mark.device_count(1)
def test_block():
    (HERE / "started").touch()
    deadline = time.monotonic() + 60
    while not (HERE / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.mark.device_count(1)
def test_later_a():
    pass


@pytest.mark.device_count(1)
def test_later_b():
    pass
"""


def environ() -> dict[str, str]:
    drop = ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "DEVPOOL_SUMMARY_BY_PARENT", "CI")
    return {k: v for k, v in os.environ.items() if k not in drop}


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=environ(), capture_output=True, text=True, timeout=120)


def pytest_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", *FAST, *args]


def closing_counts(stdout: str) -> dict[str, int]:
    """pytest's closing line as {category: tests} ('1 failed, 2 passed, 1 xfailed in 0.1s')."""
    last = [line for line in stdout.splitlines() if line.startswith("=")][-1]
    found = re.findall(r"(\d+) (\w+)", last.split(" in ")[0])
    counts = {("error" if name == "errors" else name): int(n) for n, name in found}
    counts.pop("warnings", None)
    counts.pop("warning", None)
    return counts


def report(record: Path, cwd: Path, *args: str) -> str:
    done = run([*DEVPOOL, "report", str(record), *args], cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_xfailed_and_xpassed_are_counted_as_pytest_counts_them(tmp_path: Path) -> None:
    (tmp_path / "test_cat.py").write_text(CATEGORIES)
    plain = run(pytest_argv("test_cat.py"), tmp_path)  # no --devices: plain pytest
    expected = closing_counts(plain.stdout)
    assert expected.get("xfailed") and expected.get("xpassed"), plain.stdout
    record = tmp_path / "run" / "record.jsonl"
    lock = f"--devpool-lock-dir={tmp_path / 'locks'}"
    ours = run(
        pytest_argv("test_cat.py", "--devices", "sim:0-1", lock, f"--devpool-run-record={record}"),
        tmp_path,
    )
    assert ours.returncode == plain.returncode, ours.stdout + ours.stderr
    assert closing_counts(ours.stdout) == expected

    data = json.loads(report(record, tmp_path, "--format", "json"))
    assert data["totals"] == expected
    text = report(record, tmp_path)
    totals_line = next(line for line in text.splitlines() if " xfailed" in line)
    assert dict((name, int(n)) for n, name in re.findall(r"(\d+) (\w+)", totals_line)) == expected
    markdown = report(record, tmp_path, "--format", "markdown")
    for name, count in expected.items():
        assert f"| {name} | {count} |" in markdown, markdown
    page = tmp_path / "page.html"
    report(record, tmp_path, "--html", str(page))
    chips = re.findall(r'data-outcome="(\w+)">([\d,]+) ', page.read_text())
    assert {name: int(n) for name, n in chips} == expected


def test_an_interrupted_run_says_so_and_names_what_did_not_run(tmp_path: Path) -> None:
    (tmp_path / "test_block.py").write_text(BLOCKING)
    record = tmp_path / "run" / "record.jsonl"
    argv = pytest_argv(
        "test_block.py",
        "--devices",
        "sim:0",
        f"--devpool-lock-dir={tmp_path / 'locks'}",
        f"--devpool-run-record={record}",
    )
    with open(tmp_path / "out.txt", "wb") as out:
        controller = subprocess.Popen(
            argv, cwd=tmp_path, env=environ(), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists() and controller.poll() is None:
            assert time.monotonic() < deadline, "test_block never started"
            time.sleep(0.02)
        assert controller.poll() is None, (tmp_path / "out.txt").read_text()
        controller.send_signal(signal.SIGTERM)
        assert controller.wait(timeout=60) == 2, (tmp_path / "out.txt").read_text()
    finally:
        (tmp_path / "release").touch()
        if controller.poll() is None:
            controller.kill()
            controller.wait(timeout=30)
    ended = {
        event["nodeid"]
        for event in map(json.loads, record.read_text().splitlines())
        if event["type"] == "job_end"
    }
    not_run = [
        f"test_block.py::{name}"
        for name in ("test_block", "test_later_a", "test_later_b")
        if f"test_block.py::{name}" not in ended
    ]
    assert not_run, ended

    text = report(record, tmp_path)
    verdict = text.splitlines()[1]
    assert verdict.startswith("Interrupted (exit code 2)") or verdict.startswith("interrupted")
    assert "passed" not in verdict
    for nodeid in not_run:
        assert nodeid in text, text
    data = json.loads(report(record, tmp_path, "--format", "json"))
    # test_block ran when the signal came: interrupted; the others never started: not run.
    assert data["tests"]["interrupted"] == ["test_block.py::test_block"]
    assert data["interrupted"] is True and data["not_run"] == not_run[1:]
    terminal = (tmp_path / "out.txt").read_text()
    assert "INTERRUPTED test_block.py::test_block" in terminal, terminal
    assert all(f"NOT RUN  {nodeid}" in terminal for nodeid in not_run[1:]), terminal
    assert "interrupted" in data["verdict"]
    markdown = report(record, tmp_path, "--format", "markdown")
    assert "interrupted" in markdown and all(f"`{nodeid}`" in markdown for nodeid in not_run)
    page = tmp_path / "page.html"
    report(record, tmp_path, "--html", str(page))
    html = page.read_text()
    assert "interrupted" in html
    assert all(f'data-nodeid="{nodeid}"' in html for nodeid in not_run)


@pytest.mark.parametrize("missing", ["new/deeper/page.html"])
def test_html_into_a_missing_folder(tmp_path: Path, missing: str) -> None:
    (tmp_path / "test_cat.py").write_text(CATEGORIES)
    record = tmp_path / "run" / "record.jsonl"
    run(
        pytest_argv(
            "test_cat.py",
            "--devices",
            "sim:0-1",
            f"--devpool-lock-dir={tmp_path / 'locks'}",
            f"--devpool-run-record={record}",
        ),
        tmp_path,
    )
    page = tmp_path / missing
    done = run([*DEVPOOL, "report", str(record), "--html", str(page)], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert page.is_file() and "test_cat.py::test_xfail" in page.read_text()
