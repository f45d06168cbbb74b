"""End to end: `devpool report --diff OLD NEW` on two real runs with a change between them.

Version 1 of a suite runs, then version 2 (one test breaks, one is fixed, one turns flaky,
one gets slower, one is removed, one added); the diff names each in text, Markdown and
JSON, from the record files and from the run folders alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FAST = ("-p", "no:hypothesispytest", "-p", "no:cacheprovider", "-p", "no:randomly")
DEVPOOL = (sys.executable, "-m", "devpool.cli")

V1 = """
import time

import pytest


@pytest.mark.device_count(1)
def test_breaks():
    pass


def test_fixed():
    assert 1 == 2


@pytest.mark.device_count(1)
def test_turns_flaky():
    pass


def test_slows_down():
    time.sleep(0.02)


def test_removed():
    pass


def test_steady():
    pass
"""

V2 = """
import pathlib
import time

import pytest

HERE = pathlib.Path(__file__).parent


@pytest.mark.device_count(1)
def test_breaks():
    assert 1 == 2


def test_fixed():
    pass


@pytest.mark.device_count(1)
def test_turns_flaky():
    marker = HERE / "flaky.once"
    if not marker.exists():
        marker.touch()
        assert 0, "first time"


def test_slows_down():
    time.sleep(0.6)


def test_added():
    pass


def test_steady():
    pass
"""


def environ() -> dict[str, str]:
    drop = ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "DEVPOOL_SUMMARY_BY_PARENT", "CI")
    return {k: v for k, v in os.environ.items() if k not in drop}


def devpool(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DEVPOOL, *args], cwd=cwd, env=environ(), capture_output=True, text=True, timeout=60
    )


def run_version(tmp_path: Path, source: str, name: str) -> Path:
    (tmp_path / "test_suite.py").write_text(source)
    folder = tmp_path / name
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *FAST,
            "test_suite.py",
            "--devices",
            "sim:0-1",
            f"--devpool-lock-dir={tmp_path / 'locks'}",
            f"--devpool-run-dir={folder}",
            "--devpool-reruns=1",
        ],
        cwd=tmp_path,
        env=environ(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    return folder


def test_diff_of_two_real_runs_names_every_change(tmp_path: Path) -> None:
    old = run_version(tmp_path, V1, "v1")
    new = run_version(tmp_path, V2, "v2")

    done = devpool(
        tmp_path, "report", "--diff", str(old / "record.jsonl"), str(new), "--format", "json"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(done.stdout)
    names = {
        key: [change["nodeid"].split("::")[1] for change in data[key]]
        for key in ("newly_failing", "fixed", "newly_flaky", "slower", "new", "gone")
    }
    assert names == {
        "newly_failing": ["test_breaks"],
        "fixed": ["test_fixed"],
        "newly_flaky": ["test_turns_flaky"],
        "slower": ["test_slows_down"],
        "new": ["test_added"],
        "gone": ["test_removed"],
    }
    (failing,) = data["newly_failing"]
    assert (failing["old"], failing["new"]) == ("passed", "failed")
    (slower,) = data["slower"]
    assert slower["new_time"] >= 2 * slower["old_time"] and slower["new_time"] >= 0.6

    text = devpool(tmp_path, "report", "--diff", str(old), str(new)).stdout
    assert "newly failing (1):\n  test_suite.py::test_breaks: passed → failed" in text, text
    assert "fixed (1):\n  test_suite.py::test_fixed: failed → passed" in text, text
    assert "gone (1):\n  test_suite.py::test_removed: passed → absent" in text, text
    assert "test_steady" not in text

    markdown = devpool(tmp_path, "report", "--diff", str(old), str(new), "--format", "markdown")
    assert (
        "### Newly failing (1)\n\n- `test_suite.py::test_breaks`: passed → failed"
        in markdown.stdout
    )
    assert "### Newly flaky (1)" in markdown.stdout and "### New (1)" in markdown.stdout

    # A higher factor: the slow-down is no regression any more; the same run twice: no change.
    calm = devpool(
        tmp_path, "report", "--diff", str(old), str(new), "--slower", "1000", "--format", "json"
    )
    assert json.loads(calm.stdout)["slower"] == []
    same = devpool(tmp_path, "report", "--diff", str(new), str(new)).stdout
    assert "no test changed its ending, and none got slower" in same


def test_diff_refuses_what_is_no_run_in_one_sentence(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = devpool(tmp_path, "report", "--diff", str(tmp_path / "empty"), str(tmp_path / "empty"))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "no devpool run folder" in done.stderr
    bad = devpool(tmp_path, "report", "--diff", "a", "b", "--slower", "0.5")
    assert bad.returncode != 0 and "--slower must be a factor above 1" in bad.stderr


def test_a_run_folder_is_a_run_to_every_report_and_devpool_s_files_stay_out_of_git(
    tmp_path: Path,
) -> None:
    """`devpool report RUN_FOLDER` reads the folder's record, as --diff does; a run whose
    folder is elsewhere (--devpool-run-dir) still leaves .devpool/ ignored by git, history
    and all (issue 39, 2.8)."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=60)
    folder = run_version(tmp_path, V1, "v1")
    assert (tmp_path / ".devpool" / "history.sqlite").is_file()
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert ".devpool" not in status, status
    for form in ("text", "json", "markdown"):
        by_folder = devpool(tmp_path, "report", str(folder), "--format", form)
        by_file = devpool(tmp_path, "report", str(folder / "record.jsonl"), "--format", form)
        assert by_folder.returncode == 0, by_folder.stderr
        assert by_folder.stdout == by_file.stdout and by_file.stdout, form
    (tmp_path / "empty").mkdir()
    empty = devpool(tmp_path, "report", str(tmp_path / "empty"))
    assert empty.returncode == 4 and "Traceback" not in empty.stderr, empty.stderr
    assert empty.stderr.strip().endswith(
        "is a folder without a record.jsonl: no devpool run folder"
    )
