"""End to end: one story in every report (issue 29, item 1), on real sessions.

A suite with every ending a test can have runs under devpool on sim devices; pytest's own
closing line is the oracle for the counts, plain pytest for the categories it knows. The
terminal's closing block, `devpool report` text, Markdown, JSON and HTML, and the host page's
API must all give those counts and name the same tests in each category. Runs that SIGTERM
or SIGINT interrupts and one that SIGKILL cuts, likewise. Generated records over every
combination: tests/report/test_summary_forms.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from devpool.report.record import read_record
from devpool.serve import views

FAST = ("-p", "no:hypothesispytest", "-p", "no:cacheprovider", "-p", "no:randomly")
DEVPOOL = (sys.executable, "-m", "devpool.cli")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
from test_summary_forms import html_form, markdown_form, terminal_form, text_form  # noqa: E402

PLAIN = """
import pytest


@pytest.fixture
def bad_setup():
    raise RuntimeError("setup broke")


@pytest.fixture
def bad_teardown():
    yield
    raise RuntimeError("teardown broke")


@pytest.mark.device_count(1)
def test_pass():
    pass


@pytest.mark.device_count(2)
def test_fail():
    assert 1 == 2


def test_setup_error(bad_setup):
    pass


@pytest.mark.device_count(1)
def test_teardown_error(bad_teardown):
    pass


@pytest.mark.skip(reason="not here")
def test_skip():
    pass


@pytest.mark.xfail(reason="known")
def test_xfail():
    assert 0


@pytest.mark.xfail(reason="fixed since")
def test_xpass():
    pass
"""

DEVPOOL_ONLY = """
import os
import pathlib
import time

import pytest

HERE = pathlib.Path(__file__).parent


@pytest.mark.device_count(2)
def test_flaky():
    marker = HERE / "flaky.once"
    if not marker.exists():
        marker.touch()
        assert 0, "first time"


@pytest.mark.timeout(1)
def test_timeout():
    time.sleep(30)


@pytest.mark.device_count(1)
def test_crashed():
    os._exit(3)


@pytest.mark.device_count(8)
def test_infra():
    pass


@pytest.mark.quarantine(reason="races", owner="ana", until="2099-12-31")
def test_quarantined():
    assert 0
"""

BLOCKING = """
import pathlib
import time

import pytest

HERE = pathlib.Path(__file__).parent


def test_first():
    pass


def test_fails_first():
    assert 0


@pytest.mark.device_count(1)
def test_block():
    (HERE / "started").touch()
    time.sleep(60)


@pytest.mark.device_count(1)
def test_later():
    pass
"""


def environ() -> dict[str, str]:
    drop = ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "DEVPOOL_SUMMARY_BY_PARENT", "CI")
    return {k: v for k, v in os.environ.items() if k not in drop}


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=environ(), capture_output=True, text=True, timeout=180)


def closing_counts(stdout: str) -> dict[str, int]:
    """pytest's closing line as {category: count}."""
    last = [line for line in stdout.splitlines() if line.startswith("=")][-1]
    found = re.findall(r"(\d+) (\w+)", last.split(" in ")[0])
    counts = {("error" if name == "errors" else name): int(n) for n, name in found}
    for noise in ("warning", "warnings", "deselected"):
        counts.pop(noise, None)
    return counts


def report(record: Path, cwd: Path, *args: str) -> str:
    done = run([*DEVPOOL, "report", str(record), *args], cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def ended(record: Path, name: str) -> bool:
    """Whether the record has the final job_end of a test (its last attempt, not retried)."""
    if not record.exists():
        return False
    lines = [json.loads(line) for line in record.read_text().splitlines() if line.endswith("}")]
    return any(
        e["type"] == "job_end" and e["nodeid"].endswith(name) and not e["retried"] for e in lines
    )


def terminal_block(stdout: str) -> list[str]:
    """The terminal's lines from devpool's closing block on (pytest's sections before it)."""
    lines = stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"^[-=]+ devpool: ", line)]
    return lines[starts[0] :] if starts else []


def every_form(record: Path, cwd: Path) -> dict[str, Any]:
    """Counts and named tests from each form of `devpool report`, and the host page's API."""
    data = json.loads(report(record, cwd, "--format", "json"))
    text_counts, text_named = text_form(report(record, cwd))
    md_counts, md_named = markdown_form(report(record, cwd, "--format", "markdown"))
    page = cwd / "report.html"
    report(record, cwd, "--html", str(page))
    html_counts, html_named = html_form(page.read_text())
    host = views.summarise("p", read_record(record), live=False).to_json()
    return {
        "json": (data["totals"], data["tests"]),
        "text": (text_counts, text_named),
        "markdown": (md_counts, md_named),
        "html": (html_counts, html_named),
        "host": host["counts"],
    }


def check_one_story(forms: dict[str, Any], expected: dict[str, int], terminal: list[str]) -> None:
    totals, tests = forms["json"]
    assert totals == expected
    named = {name: set(ids) for name, ids in tests.items() if name in NAMED}
    for form in ("text", "markdown", "html"):
        counts, names = forms[form]
        assert counts == expected, form
        assert names == named, form
    assert forms["host"] == expected
    if terminal:
        assert terminal_form(terminal) == named


NAMED = ("failed", "error", "timeout", "crashed", "infra", "flaky", "quarantined")
NAMED += ("interrupted", "not run")


def test_plain_categories_count_as_plain_pytest_counts_them(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text(PLAIN)
    plain = run([sys.executable, "-m", "pytest", *FAST, "test_plain.py"], tmp_path)
    expected = closing_counts(plain.stdout)
    # A pass then a teardown error: pytest counts it twice, "1 passed, 1 error" for one test.
    assert expected["passed"] == 2 and expected["error"] == 2, plain.stdout
    record = tmp_path / "run" / "record.jsonl"
    ours = run(
        [
            sys.executable,
            "-m",
            "pytest",
            *FAST,
            "test_plain.py",
            "--devices",
            "sim:0-3",
            f"--devpool-lock-dir={tmp_path / 'locks'}",
            f"--devpool-run-record={record}",
        ],
        tmp_path,
    )
    assert ours.returncode == plain.returncode, ours.stdout + ours.stderr
    assert closing_counts(ours.stdout) == expected
    check_one_story(every_form(record, tmp_path), expected, terminal_block(ours.stdout))


def test_every_ending_tells_one_story(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text(PLAIN)
    (tmp_path / "test_devpool.py").write_text(DEVPOOL_ONLY)
    record = tmp_path / "run" / "record.jsonl"
    ours = run(
        [
            sys.executable,
            "-m",
            "pytest",
            *FAST,
            "--devices",
            "sim:0-3",
            f"--devpool-lock-dir={tmp_path / 'locks'}",
            f"--devpool-run-record={record}",
            "--devpool-reruns=1",
            f"--junitxml={tmp_path / 'junit.xml'}",
        ],
        tmp_path,
    )
    assert ours.returncode == 1, ours.stdout + ours.stderr
    expected = closing_counts(ours.stdout)
    for category in ("flaky", "timeout", "crashed", "infra", "quarantined", "xfailed", "rerun"):
        assert expected.get(category), (category, ours.stdout)
    forms = every_form(record, tmp_path)
    check_one_story(forms, expected, terminal_block(ours.stdout))
    # JUnit, pytest's own file from the same reports: a failure or error element for exactly
    # the tests the summary names as not passing, a skipped one for skips, xfails, quarantine.
    _, tests = forms["json"]
    cases = {
        f"{c.get('classname')}.py::{c.get('name')}": {child.tag for child in c}
        for c in ET.parse(tmp_path / "junit.xml").iter("testcase")
    }
    failing = {n for n, tags in cases.items() if tags & {"failure", "error"}}
    assert failing == {
        n for cat in ("failed", "error", "timeout", "crashed", "infra") for n in tests.get(cat, [])
    }
    skipped = {n for n, tags in cases.items() if "skipped" in tags}
    assert skipped == {n for cat in ("skipped", "xfailed", "quarantined") for n in tests[cat]}
    text = report(record, tmp_path)
    # named, not only counted
    assert re.search(r"^flaky \(\d+\):\n(  .*\n)*  test_devpool.py::test_flaky$", text, re.M), text


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_a_signal_tells_one_story(tmp_path: Path, how: str) -> None:
    (tmp_path / "test_block.py").write_text(BLOCKING)
    record = tmp_path / "run" / "record.jsonl"
    argv = [sys.executable, "-m", "pytest", *FAST, "test_block.py", "--devices", "sim:0"]
    argv += [
        f"--devpool-lock-dir={tmp_path / 'locks'}",
        f"--devpool-run-record={record}",
        "--devpool-reruns=1",
    ]
    with open(tmp_path / "out.txt", "wb") as out:
        controller = subprocess.Popen(
            argv, cwd=tmp_path, env=environ(), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists() or not ended(record, "test_fails_first"):
            assert controller.poll() is None, (tmp_path / "out.txt").read_text()
            assert time.monotonic() < deadline, "test_block never started"
            time.sleep(0.02)
        controller.send_signal(getattr(signal, how))
        status = controller.wait(timeout=60)
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait(timeout=30)
    stdout = (tmp_path / "out.txt").read_text()
    forms = every_form(record, tmp_path)
    totals, tests = forms["json"]
    assert tests["interrupted"] == ["test_block.py::test_block"]
    later_ran = ended(record, "test_later")  # the plan may put it before test_block
    assert tests.get("not run") == (None if later_ran else ["test_block.py::test_later"])
    assert tests["rerun"] == ["test_block.py::test_fails_first"]
    assert tests["failed"] == ["test_block.py::test_fails_first"]
    if how == "SIGKILL":
        assert status == -signal.SIGKILL
        check_one_story(forms, totals, [])
        return
    assert status == 2, stdout
    # pytest's closing line counts what ended and what the signal cut, as the report does;
    # the summary adds what did not run.
    assert closing_counts(stdout)["interrupted"] == totals["interrupted"] == 1, stdout
    expected = {**closing_counts(stdout), **({} if later_ran else {"not run": 1})}
    check_one_story(forms, expected, terminal_block(stdout))
