"""The selective runs' target project and sessions, shared by test_selective_runs.py and
test_ray_select.py: a small project in a git repository, a session in it read back from
its run record. Imported by the test modules of this folder (see sessions.py).
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
from sessions import FAST

CI_VARIABLES = ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "GITLAB_CI", "BUILDKITE", "CI")

PROJECT = {
    "pyproject.toml": """
        [tool.pytest.ini_options]
        pythonpath = ["."]
        """,
    # pytester keeps each session's basetemp, stdout and stderr in the project: no sources.
    ".gitignore": ".devpool/\n__pycache__/\nbuild/\nrunpytest-*\nstdout\nstderr\n",
    "lib.py": """
        def add(a, b):
            return a + b


        def mul(a, b):
            return a * b
        """,
    "configs/model.yaml": "depth: 2\n",
    "kernels/a.cu": "// kernel a\n",
    "tests/conftest.py": "# the bucket's conftest\n",
    "tests/test_math.py": """
        import lib


        def test_add():
            assert lib.add(2, 3) == 5


        def test_mul():
            assert lib.mul(2, 3) == 6


        def test_both():
            assert lib.add(1, 1) + lib.mul(1, 1) == 3
        """,
    "tests/test_data.py": """
        import os
        from pathlib import Path

        import pytest

        ROOT = Path(__file__).parent.parent


        def test_reads_config():
            assert "depth" in (ROOT / "configs" / "model.yaml").read_text()


        def test_plain():
            assert os.environ.get("BREAK_PLAIN") is None


        @pytest.mark.depends_on("kernels/*.cu")
        def test_kernels():
            pass


        @pytest.mark.device_count(8)
        def test_eight(devpool_devices):
            assert len(devpool_devices) == 8
        """,
}
MATH = {f"tests/test_math.py::test_{n}" for n in ("add", "mul", "both")}
DATA = {f"tests/test_data.py::test_{n}" for n in ("reads_config", "plain", "kernels", "eight")}


def git(root: Path, *args: str) -> None:
    """git in the project, as a fixed user; fails the test when git does."""
    subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=root,
        check=True,
        capture_output=True,
    )


def write(root: Path, files: dict[str, str]) -> None:
    """The project's files (path → text, dedented)."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))


def git_project(root: Path, files: dict[str, str]) -> Path:
    """The files written in root and committed there, in a new git repository."""
    write(root, files)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    return root


class Run:
    """One pytest session in the project, read back from its run record."""

    def __init__(
        self, pytester: pytest.Pytester, tmp: Path, name: str, *args: str, timeout: float = 120
    ) -> None:
        self.record = tmp / f"{name}.jsonl"
        self.result = pytester.runpytest_subprocess(
            *FAST,
            f"--devpool-lock-dir={tmp / 'locks'}",
            f"--devpool-run-record={self.record}",
            "--devpool-skip-unsatisfiable",
            *args,
            "tests",
            timeout=timeout,
        )
        self.events = [json.loads(line) for line in self.record.read_text().splitlines()]

    @property
    def ran(self) -> set[str]:
        """Node ids that ran or were reported skipped (unsatisfiable ones too)."""
        return {e["nodeid"] for e in self.events if e["type"] == "job_end"}

    @property
    def select(self) -> dict[str, Any]:
        (event,) = [e for e in self.events if e["type"] == "select"]
        return event

    def output(self) -> str:
        return "\n".join(self.result.outlines)


def record(
    pytester: pytest.Pytester,
    tmp: Path,
    devices: str = "sim:0-1",
    *,
    name: str = "record",
    more: tuple[str, ...] = (),
    timeout: float = 120,
) -> Run:
    """A `record` session that must pass and write a baseline."""
    run = Run(
        pytester,
        tmp,
        name,
        *more,
        "--devices",
        devices,
        "--devpool-select",
        "record",
        timeout=timeout,
    )
    assert run.result.ret == 0, run.output()
    assert "devpool select: recorded baseline" in run.output()
    return run


def native_project(folder: str) -> dict[str, str]:
    """A project whose test loads libk.so, built from k.c into folder (see build_library)."""
    return {
        "pyproject.toml": PROJECT["pyproject.toml"] + '[tool.devpool.select]\nignore = ["*.c"]\n',
        ".gitignore": PROJECT[".gitignore"],
        "k.c": "int k(void) { return 1; }\n",
        "tests/test_native.py": f"""
            import ctypes
            from pathlib import Path

            LIB = Path(__file__).parent.parent / "{folder}" / "libk.so"


            def test_native():
                assert ctypes.CDLL(str(LIB)).k() in (1, 2)


            def test_python():
                assert True
            """,
    }


def build_library(root: Path, folder: str, value: int) -> None:
    """Build folder/libk.so from a k.c whose k() returns value."""
    (root / "k.c").write_text(f"int k(void) {{ return {value}; }}\n")
    (root / folder).mkdir(exist_ok=True)
    target = f"{folder}/libk.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", target, "k.c"], cwd=root, check=True)
