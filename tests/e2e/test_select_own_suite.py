"""Selective runs of devpool's own suite: where devpool is project code, what its plugins
run inside a test's window is the run's machinery, not the test's (select/own_hooks.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from select_project import PROJECT, Run, git_project, record

import devpool

pytestmark = pytest.mark.usefixtures("selective_env")

OWN = {
    "pyproject.toml": PROJECT["pyproject.toml"],
    ".gitignore": PROJECT[".gitignore"],
    # A wider fixture: the worker's leak check runs around its setup, in test_a's window.
    "tests/test_a.py": """
        import pytest


        @pytest.fixture(scope="module")
        def shared():
            return 1


        def test_a(shared):
            assert shared == 1
        """,
    "tests/test_b.py": """
        import os

        from devpool.devices import leftovers


        def test_b():
            assert leftovers.__file__.startswith(os.path.abspath("src"))  # the copy runs
            assert leftovers.has_children() in (True, False)
        """,
}


def test_devpools_own_hooks_count_for_no_test_where_devpool_is_the_project(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The running devpool is a copy inside the project: a change to code its hooks run in
    every test's window (the leak check's has_children) selects only the test that calls
    that code itself; the same runs under plain pytest select alike."""
    source = pytester.path / "src" / "devpool"
    shutil.copytree(
        Path(devpool.__file__).parent, source, ignore=shutil.ignore_patterns("__pycache__")
    )
    root = git_project(pytester.path, OWN)
    monkeypatch.setenv("PYTHONPATH", str(root / "src"))  # sessions and workers run the copy
    recorded = record(pytester, tmp_path)
    assert recorded.ran == {"tests/test_a.py::test_a", "tests/test_b.py::test_b"}
    leftovers = source / "devices" / "leftovers.py"
    text = leftovers.read_text()
    body = "    except ChildProcessError:\n        return False\n"
    assert text.count(body) == 1
    changed = body.replace("return False", "return bool(os.getpid() < 0)")
    leftovers.write_text(text.replace(body, changed))
    run = Run(pytester, tmp_path, "changed", "--devices", "sim:0-1", "--devpool-select", "on")
    assert run.result.ret == 0, run.output()
    assert run.ran == {"tests/test_b.py::test_b"}, run.output()
