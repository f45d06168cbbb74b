"""End to end: the `devpool` command as a newcomer types it (issue 13, part 6).

Each test runs the command in a subprocess, in a project folder of its own, and checks
what the user sees: the exit status, one-sentence errors, where files land.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devpool.session.run_folder import RUN_ID

PYTEST = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:rerunfailures")
PLATFORMS = """
[tool.devpool.platforms]
a2a3sim = "sim"
"""


def devpool(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "DEVPOOL_"))}
    environ.pop("CI", None)
    return subprocess.run(
        [sys.executable, "-m", "devpool.cli", *args],
        cwd=cwd,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.device_count(2)\ndef test_two(): pass\n\n"
        "def test_cpu(): pass\n\n"
        "def test_other(): pass\n"
    )
    return tmp_path


@pytest.mark.parametrize("command", [("pytest",), (sys.executable, "-m", "pytest")])
def test_run_accepts_pytest_after_the_dashes_and_keeps_one_run_folder(
    project: Path, command: tuple[str, ...]
) -> None:
    lock_dir = f"--devpool-lock-dir={project / 'locks'}"
    done = devpool(
        project, "run", "--", *command, "test_x.py", *PYTEST, "--devices", "sim:0-1", lock_dir
    )
    assert done.returncode == 0, done.stdout + done.stderr
    folders = list((project / ".devpool" / "runs").iterdir())
    assert len(folders) == 1, folders  # record, logs and exit code: one run folder
    assert RUN_ID.fullmatch(folders[0].name)
    assert {p.name for p in folders[0].iterdir()} >= {"record.jsonl", "logs", "exitcode"}
    assert any((folders[0] / "logs").iterdir())  # the worker logs are here too
    start = json.loads((folders[0] / "record.jsonl").read_text().splitlines()[0])
    assert start["log_dir"] == str(folders[0] / "logs")
    assert start["run_id"] == folders[0].name  # one id for the folder and the record
    assert f"record {folders[0] / 'record.jsonl'}" in done.stderr


def test_capacity_and_shard_pass_pytest_options_after_the_dashes(project: Path) -> None:
    after = ["--", "test_x.py", *PYTEST, "--devices", "sim:0-3", "-k", "two or cpu"]
    after += ["--devpool-max-parallel", "2"]
    done = devpool(project, "capacity", *after)
    assert done.returncode == 0, done.stderr
    assert "2 tests collected; platform sim; runner classes: sim-4 (4 devices)" in done.stdout
    done = devpool(project, "shard", "--runners", "2", "--format", "json", *after)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["devices_per_runner"] == 4
    assert sorted(t for s in data["split"] for t in s["tests"]) == [
        "test_x.py::test_cpu",
        "test_x.py::test_two",
    ]


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        # an abbreviation is refused, never read as another option
        (("shard", "--runners", "2", "--devices", "4"), "unrecognized arguments: --devices"),
        (("report", "--ht", "out.html"), "unrecognized arguments: --ht"),
        (("capacity", "--devices-per", "4"), "unrecognized arguments: --devices-per"),
        (("frobnicate",), "argument COMMAND: invalid choice: 'frobnicate'"),
        (("shard", "verify"), "the following arguments are required: RECORD"),
    ],
)
def test_usage_errors_exit_4_with_one_sentence(
    project: Path, args: tuple[str, ...], sentence: str
) -> None:
    done = devpool(project, *args)
    assert done.returncode == 4
    assert sentence in done.stderr
    assert done.stderr.count("\n") == 1 and "usage:" not in done.stderr


def test_locks_reads_the_lock_dir_of_the_project_and_its_profile(project: Path) -> None:
    (project / "pyproject.toml").write_text(
        f'[tool.devpool]\nlock-dir = "{project / "mine"}"\n\n'
        f'[tool.devpool.profiles.ci]\nlock-dir = "{project / "ci-locks"}"\n'
    )
    (project / "sub").mkdir()
    done = devpool(project / "sub", "locks")  # the project's table, from a folder below it
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"no device lock files in {project / 'mine'}\n"
    done = devpool(project, "locks", CI="true")
    assert done.stdout == f"no device lock files in {project / 'ci-locks'}\n"


def test_capacity_reports_for_the_configured_platform(project: Path) -> None:
    (project / "pyproject.toml").write_text('[tool.devpool]\ndevices = "a2a3sim:0-5"\n' + PLATFORMS)
    done = devpool(project, "capacity", "--", *PYTEST)
    assert done.returncode == 0, done.stderr
    assert "platform a2a3sim; runner classes: a2a3sim-6 (6 devices)" in done.stdout
    done = devpool(project, "capacity", "--platform", "sim", "--devices-per-runner", "8")
    assert "platform sim; runner classes: sim-8 (8 devices)" in done.stdout


REPEATS = """
import os

def test_a_passes():
    pass

def test_b_fails_once():
    try:
        os.close(os.open("first", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    assert False, "the first of the repeats fails"

def test_c_fails():
    assert False
"""


def test_repeat_table_is_sorted_and_in_devpool_report(tmp_path: Path) -> None:
    (tmp_path / "test_r.py").write_text(REPEATS)
    record = tmp_path / "record.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "test_r.py", *PYTEST, "--devices", "sim:0-1",
         "--devpool-repeat=3", f"--devpool-run-record={record}",
         f"--devpool-lock-dir={tmp_path / 'locks'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    expected = [
        "0/3 passed (0%)  test_r.py::test_c_fails  failed on: cpu ×3",
        "2/3 passed (67%)  test_r.py::test_b_fails_once  failed on: cpu ×1",
        "3/3 passed (100%)  test_r.py::test_a_passes",
    ]
    table = done.stdout.split("devpool: repeat results")[1].splitlines()[1:4]
    assert table == expected  # the lowest pass rate first, whatever order they ended in
    report = devpool(tmp_path, "report", str(record))
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    at = lines.index("repeat results (lowest pass rate first):")
    assert lines[at + 1 : at + 4] == [f"  {line}" for line in expected]
    data = json.loads(devpool(tmp_path, "report", str(record), "--format", "json").stdout)
    assert [(r["nodeid"], r["passed"], r["runs"]) for r in data["repeats"]] == [
        ("test_r.py::test_c_fails", 0, 3),
        ("test_r.py::test_b_fails_once", 2, 3),
        ("test_r.py::test_a_passes", 3, 3),
    ]
    markdown = devpool(tmp_path, "report", str(record), "--format", "markdown").stdout
    assert "| 2/3 | 67% | `test_r.py::test_b_fails_once` | cpu ×1 |" in markdown


def test_the_readmes_first_command_prints_no_warning_without_the_dev_plugins(
    tmp_path: Path,
) -> None:
    # A fresh `pip install -e .` has no pytest-asyncio: devpool's own pyproject.toml must name
    # no setting that only a [dev] plugin knows (pytest warns of an unknown config option).
    root = Path(__file__).resolve().parents[2]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "DEVPOOL_"))}
    environ.pop("CI", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "examples", "--devices", "sim:0-7"]
        + ["-p", "no:asyncio", "-p", "no:cacheprovider", f"--devpool-run-dir={tmp_path / 'run'}"]
        + [f"--devpool-lock-dir={tmp_path / 'locks'}"],
        cwd=root,
        env=environ,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    closing = done.stdout.strip().splitlines()[-1]
    assert "passed" in closing and "warning" not in closing, done.stdout
    assert "PytestConfigWarning" not in done.stdout + done.stderr, done.stdout


def test_capacity_and_shard_each_say_how_they_count_device_seconds(tmp_path: Path) -> None:
    # The two sums differ on one suite (a memory test's share, a CPU test's seconds): each
    # output says what it counts and how the other command counts.
    (tmp_path / "pyproject.toml").write_text(
        '[tool.devpool.platforms]\nsim = { kind = "sim", memory = "80GiB" }\n'
    )
    (tmp_path / "test_m.py").write_text(
        "import pytest\n\n"
        '@pytest.mark.device_memory("8GiB")\ndef test_mem(): pass\n\n'
        "@pytest.mark.device_count(2)\ndef test_two(): pass\n\n"
        "def test_cpu(): pass\n"
    )
    after = ["--", "test_m.py", *PYTEST]
    capacity = devpool(tmp_path, "capacity", "--platform", "sim", *after)
    shard = devpool(tmp_path, "shard", "--runners", "2", "--platform", "sim", *after)
    for done in (capacity, shard):
        assert done.returncode == 0, done.stdout + done.stderr
    said = [line for line in capacity.stdout.splitlines() if "device-s =" in line]
    assert said and "whole devices" in said[0] and "devpool shard" in said[0], capacity.stdout
    said = [line for line in shard.stdout.splitlines() if "device-s =" in line]
    assert said and "share" in said[0] and "devpool capacity" in said[0], shard.stdout


def test_run_with_devpool_off_is_pytest_alone_with_no_word_of_options_it_added(
    project: Path,
) -> None:
    """`devpool run` with no --devices (and none in pyproject) runs plain pytest: the same
    terminal as pytest alone, its exit code, no notice of run-folder options the user never
    gave, and one line saying there is no run record (issue 39, 3)."""
    (project / "test_x.py").write_text(
        (project / "test_x.py").read_text() + "\ndef test_fails(): assert 0\n"
    )
    plain = subprocess.run(
        [sys.executable, "-m", "pytest", *PYTEST, "-p", "no:randomly", "test_x.py"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=240,
    )
    done = devpool(project, "run", "--", *PYTEST, "-p", "no:randomly", "test_x.py")
    assert done.returncode == plain.returncode == 1, done.stdout + done.stderr
    assert "--devpool-run" not in done.stdout + done.stderr, done.stdout

    def outcomes(out: str) -> list[str]:
        return [line for line in out.splitlines() if line.startswith(("test_x.py", "FAILED"))]

    assert outcomes(done.stdout) == outcomes(plain.stdout), done.stdout
    assert done.stderr.strip() == (
        "devpool run: exit code 1; devpool was off (no --devices), so no run record"
    )
    assert not (project / ".devpool").exists()
    refused = devpool(project, "run", "--run-record", "r.jsonl", "--", "test_x.py")
    assert refused.returncode == 4 and "--run-record needs devpool on" in refused.stderr
    assert "Traceback" not in refused.stderr and refused.stdout == "", refused.stderr
