"""End to end: selective runs for a fleet. A baseline recorded in one checkout selects in
another at another path; baselines kept in the fleet's PostgreSQL beside the history.

Each session is a real pytest process in a real git repository on sim devices; what it ran
is read back from its run record."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from select_project import PROJECT, build_library, git, native_project, write
from sessions import FAST

pytestmark = pytest.mark.usefixtures("selective_env")


class Session:
    """One pytest session started in `root` (its own cwd), read back from its run record."""

    def __init__(self, root: Path, tmp: Path, name: str, *args: str, env: Any = None) -> None:
        self.record = tmp / f"{name}.jsonl"
        self.done = subprocess.run(
            [sys.executable, "-m", "pytest", *FAST, f"--devpool-lock-dir={tmp / 'locks'}",
             f"--devpool-run-record={self.record}", "--devpool-skip-unsatisfiable",
             "--devices", "sim:0-1", *args, "tests"],
            cwd=root, capture_output=True, text=True, timeout=240, env=env,
        )  # fmt: skip
        self.output = self.done.stdout + self.done.stderr
        lines = self.record.read_text().splitlines() if self.record.exists() else []
        self.events = [json.loads(line) for line in lines]

    @property
    def ran(self) -> set[str]:
        return {e["nodeid"] for e in self.events if e["type"] == "job_end"}

    @property
    def select(self) -> dict[str, Any]:
        (event,) = [e for e in self.events if e["type"] == "select"]
        return event


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps")
def test_a_baseline_recorded_at_one_checkout_path_selects_alike_at_another(
    tmp_path: Path,
) -> None:
    """A runner checks out at /runner/1/_work/x, another at /home/ci/x: the baseline names
    files, blocks and the project's own libraries relative to the rootdir."""
    first = tmp_path / "runner" / "1" / "_work" / "x"
    files = native_project("build")
    files["tests/test_math.py"] = PROJECT["tests/test_math.py"]
    files["lib.py"] = PROJECT["lib.py"]
    write(first, files)
    build_library(first, "build", 1)
    git(first, "init", "-q")
    git(first, "add", "-A")
    git(first, "commit", "-qm", "init")
    isolated = ("--devpool-isolation", "job")  # a library one test loaded stays in a warm worker
    recorded = Session(first, tmp_path, "record", *isolated, "--devpool-select", "record")
    assert recorded.done.returncode == 0, recorded.output
    # A fresh checkout elsewhere: every file copied anew (new mtimes), the baseline with it.
    second = tmp_path / "home" / "ci" / "x"
    shutil.copytree(first, second, symlinks=True, copy_function=shutil.copy)

    def on(root: Path, name: str) -> Session:
        run = Session(root, tmp_path, name, *isolated, "--devpool-select", "on")
        assert run.done.returncode == 0, run.output
        assert run.select["full_run"] is False, run.output
        return run

    assert on(second, "same").ran == set()
    # The same change at each path selects the same tests: the second checkout first, while
    # the first one's library is still the recorded one.
    ran = {}
    for root in (second, first):
        build_library(root, "build", 2)
        lib = root / "lib.py"
        lib.write_text(lib.read_text().replace("return a * b", "return b * a"))
        git(root, "commit", "-qam", "k returns 2, mul turned")
        ran[root] = on(root, root.parent.name).ran
    assert (
        ran[second]
        == ran[first]
        == {
            "tests/test_native.py::test_native",
            "tests/test_math.py::test_mul",
            "tests/test_math.py::test_both",
        }
    )
