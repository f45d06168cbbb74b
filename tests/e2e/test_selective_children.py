"""End to end: a recorded test depends on what the processes it starts run of the project.

A project whose tests start Python processes that import devpool (as a test that runs a
pytest session, or devpool's command line, does): one with the worker's environment, one
with an environment of its own, one that forks, one killed before it can tell, and a fork of
the worker itself. Recorded,
then one function of lib.py edited: the next `on` session runs the tests whose processes
ran it, and the killed one, which any change selects (and no change does not).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from select_project import PROJECT, Run, git_project, record

from devpool.select import children

pytestmark = pytest.mark.usefixtures("selective_env")

CHILDREN = {
    # A test that asks for a declared resource is not "device count changed" every run.
    "pyproject.toml": PROJECT["pyproject.toml"] + "[tool.devpool.resources]\ndb = 1\n",
    ".gitignore": PROJECT[".gitignore"],
    "lib.py": """
        def add(a, b):
            return a + b


        def mul(a, b):
            return a * b


        def sub(a, b):
            return a - b


        def div(a, b):
            return a / b
        """,
    "tests/test_children.py": """
        import os
        import subprocess
        import sys

        import pytest

        ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


        def child(code, env=None):
            done = subprocess.run(
                [sys.executable, "-c", "import devpool, lib\\n" + code],
                cwd=ROOT, env=env, capture_output=True, text=True,
            )
            return done


        def test_child_adds():
            assert child("assert lib.add(2, 3) == 5").returncode == 0


        def test_child_with_its_own_environment_subtracts():
            env = {"PATH": os.environ["PATH"], "PYTHONPATH": ROOT}
            assert child("assert lib.sub(3, 2) == 1", env).returncode == 0


        def test_grandchild_fork_multiplies():
            code = (
                "import os\\n"
                "pid = os.fork()\\n"
                "if pid == 0:\\n"
                "    os._exit(0 if lib.mul(2, 3) == 6 else 1)\\n"
                "assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0\\n"
            )
            assert child(code).returncode == 0


        def test_own_fork_divides():
            pid = os.fork()
            if pid == 0:
                import lib

                os._exit(0 if lib.div(6, 3) == 2 else 1)
            assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


        def test_child_killed():
            code = "import os, signal\\nlib.add(1, 1)\\nos.kill(os.getpid(), signal.SIGKILL)"
            assert child(code).returncode == -9


        @pytest.mark.resources(db=1)
        def test_no_child():
            assert True
        """,
}
TESTS = "tests/test_children.py::test_"


def select_after_edit(pytester: pytest.Pytester, tmp: Path, old: str, new: str) -> Run:
    """An `on` session after one edit of lib.py (put back after it)."""
    lib = pytester.path / "lib.py"
    text = lib.read_text()
    lib.write_text(text.replace(old, new))
    run = Run(pytester, tmp, new, "--devices", "sim:0-1", "--devpool-select", "on", "-v")
    lib.write_text(text)
    assert run.result.ret == 0, run.output()
    return run


def test_what_a_tests_processes_ran_selects_it_and_a_killed_one_fails_closed(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    git_project(pytester.path, CHILDREN)
    recorded = record(pytester, tmp_path)
    assert len(recorded.ran) == 6, recorded.output()
    killed = f"{TESTS}child_killed"
    # Nothing changed: nothing runs, the killed test neither.
    run = Run(pytester, tmp_path, "none", "--devices", "sim:0-1", "--devpool-select", "on")
    assert run.ran == set(), run.output()
    run = select_after_edit(pytester, tmp_path, "return a * b", "return b * a")
    # Seen in a fork of the child (it ends with os._exit); the killed test: what its process
    # ran is not known, so any change selects it.
    assert run.ran == {f"{TESTS}grandchild_fork_multiplies", killed}, run.output()
    assert (
        f"selected {killed}: any change selects it (lib.py changed; a process it started (pid "
    ) in run.output()
    assert "ended before telling what it ran)" in run.output()
    # Found through its ancestors: the child's environment did not name the folder.
    run = select_after_edit(pytester, tmp_path, "return a - b", "return -(b - a)")
    assert run.ran == {f"{TESTS}child_with_its_own_environment_subtracts", killed}
    run = select_after_edit(pytester, tmp_path, "return a + b", "return b + a")
    assert run.ran == {f"{TESTS}child_adds", killed}
    # A fork of the worker itself (the test's os.fork) is one below the test too.
    run = select_after_edit(pytester, tmp_path, "return a / b", "return a * (1 / b)")
    assert run.ran == {f"{TESTS}own_fork_divides", killed}


def test_a_python_process_that_never_imports_devpool_tells_through_the_installed_pth(
    tmp_path: Path,
) -> None:
    """A wheel installs devpool-children.pth beside the package: a Python process of that
    environment started below a recording worker tells what it ran without importing devpool."""
    source = Path(__file__).parents[2]
    wheels, venv = tmp_path / "wheels", tmp_path / "venv"
    build = dict(os.environ, DEVPOOL_PURE_PYTHON="1")
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, source],
        env=build,
        check=True,
        capture_output=True,
    )
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    (wheel,) = wheels.glob("devpool-*.whl")
    subprocess.run(
        [*pip, "--python", python, "install", "--no-index", "--no-deps", wheel],
        # a PYTHONPATH naming a devpool checkout (its egg-info) would make pip skip the wheel
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        check=True,
        capture_output=True,
    )
    project = tmp_path / "project"
    project.mkdir()
    (project / "mod.py").write_text("def used():\n    return 1\n\n\ndef unused():\n    return 2\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(children, "BASE", tmp_path / "base")
        folder = children.make_folder(project)
    env = {"PATH": os.environ["PATH"], children.FOLDER: str(folder)}
    code = "import mod\nmod.used()\n"  # it never imports devpool itself
    subprocess.run([python, "-c", code], cwd=project, env=env, check=True)
    gathered = children.gather(folder, since=time.time())
    assert gathered.why == ""
    assert gathered.spots == {("mod.py", 0), ("mod.py", 1)}
