"""End to end: a passing test's reports wait for its worker's next write (issue 53, item 5),
and a worker that dies meanwhile still tells what passed (worker/held.py).

A test that hangs after its setup passed ends as a failure of its body, as pytest-timeout's
does in plain pytest (the setup's report was held when the worker was ended); a test whose
finalizer kills its worker keeps its passing body.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

FAST = ("-p", "no:hypothesispytest", "-p", "no:cacheprovider", "-p", "no:randomly")

SUITE = """
import os
import time

import pytest


@pytest.fixture
def prepared():
    print("set up")
    yield 1


def test_passes(prepared):
    pass


@pytest.mark.timeout(2)
def test_hangs_in_its_body(prepared):
    time.sleep(60)


def test_passes_after(prepared):
    pass
"""

DIES_IN_TEARDOWN = """
import os


def test_dies_in_its_teardown(request):
    request.addfinalizer(lambda: os._exit(4))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "DEVPOOL_"))}
    env.pop("CI", None)
    return env


def _junit(path: Path) -> dict[str, list[str]]:
    """Each test case's name → the kinds of its children (failure, error, skipped), but
    devpool's <properties> (where it ran)."""
    cases = ET.parse(path).getroot().iter("testcase")
    return {
        case.get("name", ""): sorted(c.tag for c in case if c.tag != "properties") for case in cases
    }


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", *FAST, *args],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def test_a_hang_after_a_held_setup_fails_in_its_body_as_plain_pytest_s(tmp_path: Path) -> None:
    (tmp_path / "test_held.py").write_text(SUITE)
    plain = _pytest(tmp_path, "test_held.py", "-p", "timeout", f"--junitxml={tmp_path / 'p.xml'}")
    ours = _pytest(
        tmp_path, "test_held.py", "--devices", "sim:0-1", "--devpool-reruns-infra=0",
        f"--devpool-lock-dir={tmp_path / 'locks'}", f"--junitxml={tmp_path / 'd.xml'}",
    )  # fmt: skip
    assert plain.returncode == ours.returncode == 1, plain.stdout + ours.stdout + ours.stderr
    expected = _junit(tmp_path / "p.xml")
    assert expected["test_hangs_in_its_body"] == ["failure"], expected
    assert _junit(tmp_path / "d.xml") == expected, ours.stdout
    # Counted as plain pytest counts it: a failed body, not a setup error.
    assert "1 failed" in plain.stdout.splitlines()[-1]
    last = ours.stdout.splitlines()[-1]
    assert "error" not in last and "2 passed" in last, ours.stdout


def test_a_worker_dead_in_a_teardown_keeps_its_passed_body(tmp_path: Path) -> None:
    (tmp_path / "test_dies.py").write_text(DIES_IN_TEARDOWN)
    ours = _pytest(
        tmp_path, "test_dies.py", "--devices", "sim:0-1", "--devpool-reruns-infra=0", "-rA",
        f"--devpool-lock-dir={tmp_path / 'locks'}", f"--junitxml={tmp_path / 'd.xml'}",
    )  # fmt: skip
    summary = ours.stdout[ours.stdout.index("short test summary info") :]
    # The body's report was held when the worker died: read back from its held file.
    assert "PASSED test_dies.py::test_dies_in_its_teardown" in summary, ours.stdout
    assert "CRASHED test_dies.py::test_dies_in_its_teardown" in summary, ours.stdout
    assert _junit(tmp_path / "d.xml")["test_dies_in_its_teardown"] == ["error"], ours.stdout
    assert not list((tmp_path / ".devpool").rglob("*.held")), "a held file was left behind"
