"""`devpool report` in every format counts what the terminal's closing line counted, in its
order, "deselected" included (-k and devpool's own platform deselection), and devpool's own
categories (flaky, rerun) in the order the terminal gives them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sessions import closing_line, run

SUITE = """
from pathlib import Path

import pytest

@pytest.mark.parametrize("i", range(10))
def test_passes(i):
    pass

def test_fails_once():
    assert False

def test_fails_twice():
    assert False

def test_left_out_by_k():
    pass

@pytest.mark.platforms(["cuda"])
def test_only_on_cuda():
    pass

def test_flaky():
    mark = Path(__file__).with_name("failed-once")
    if not mark.exists():
        mark.write_text("1")
        assert False
"""


@pytest.fixture(autouse=True)
def _only_named_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


def terminal_counts(result: pytest.RunResult) -> list[tuple[str, int]]:
    """`2 failed, 10 passed, 2 deselected in 1.2s` → [("failed", 2), ...]."""
    line = re.sub(r" in [0-9.]+s.*$", "", closing_line(result).strip("= "))
    return [(name, int(n)) for n, name in (part.split(" ", 1) for part in line.split(", "))]


def report(pytester: pytest.Pytester, form: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "devpool.cli", "report", "record.jsonl", "--format", form],
        cwd=pytester.path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_report_form_counts_as_the_terminal_did(
    pytester: pytest.Pytester, lock: Path
) -> None:
    pytester.makepyfile(test_counts=SUITE)

    result = run(
        pytester,
        lock,
        "--devices=sim:0-1",
        "-k",
        "not left_out",
        "--devpool-run-record=record.jsonl",
        "--devpool-reruns=1",
    )

    shown = terminal_counts(result)
    assert ("deselected", 2) in shown and ("flaky", 1) in shown, shown
    text = report(pytester, "text")
    assert ", ".join(f"{n} {name}" for name, n in shown) in text.splitlines(), text
    markdown = report(pytester, "markdown")
    rows = re.findall(r"^\| (\w[\w ]*) \| (\d+) \|$", markdown, re.M)
    assert [(name, int(n)) for name, n in rows] == shown
    totals = json.loads(report(pytester, "json"))["totals"]
    assert list(totals.items()) == shown
