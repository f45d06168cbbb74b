"""`devpool rerun latest` end to end: it runs what did not pass, with the run's arguments,
until nothing is left."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SUITE = """
import os

import pytest

def test_passes():
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_fails_until_fixed(n):
    assert os.environ.get("FIXED") or n == 1

def test_errs_until_fixed(broken):
    pass

@pytest.fixture
def broken():
    assert os.environ.get("FIXED")
"""


def devpool(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "DEVPOOL_"))}
    environ.pop("CI", None)
    return subprocess.run(
        [sys.executable, "-m", "devpool.cli", *args],
        cwd=cwd,
        env={**environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_rerun_latest_runs_what_did_not_pass_until_all_passed(tmp_path: Path) -> None:
    (tmp_path / "test_r.py").write_text(SUITE)
    lock = tmp_path / "locks"
    lock.mkdir()
    args = ["-p", "devpool.plugin", "-p", "no:cacheprovider", "--devices=sim:0-1"]
    first = devpool(tmp_path, "run", "--", *args, f"--devpool-lock-dir={lock}", "-rA")
    assert first.returncode == 1, first.stdout + first.stderr

    again = devpool(tmp_path, "rerun", "latest")

    assert again.returncode == 1, again.stdout + again.stderr
    assert (
        again.stdout.startswith("devpool rerun: 2 tests of run ")
        and "did not pass (1 failed, 1 error): running them again" in again.stdout
    )
    # The run's own arguments came again: -rA lists every test it ran.
    listed = [line.split() for line in again.stdout.splitlines()]
    ran = {words[1] for words in listed if words[:1] in (["PASSED"], ["FAILED"], ["ERROR"])}
    assert ran == {"test_r.py::test_errs_until_fixed", "test_r.py::test_fails_until_fixed[2]"}
    assert "1 failed, 2 deselected, 1 error" in again.stdout

    fixed = devpool(tmp_path, "rerun", "latest", FIXED="1")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "2 passed, 2 deselected" in fixed.stdout

    done = devpool(tmp_path, "rerun", "latest")
    assert done.returncode == 0
    assert done.stdout.startswith("devpool rerun: every test of run ")
    assert done.stdout.endswith("passed: nothing to rerun\n")
