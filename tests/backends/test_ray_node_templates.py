"""backends/ray/node_templates.py: a node's template folders outlive no actor for long.

An actor killed with its run (a SIGKILLed controller, a lost node: tests/e2e/test_ray.py
makes both) cannot remove its folder; the next run's actor on the node does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from devpool.backends.ray.node_templates import PREFIX, NodeTemplates


def _ended_pid() -> int:
    """The pid of a process that ran and was reaped."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


def test_a_new_actor_sweeps_the_folders_of_gone_actors_and_keeps_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = tmp_path / f"{PREFIX}{_ended_pid()}-abc"
    gone.mkdir()
    (gone / "template-1.log").write_text("x")
    live = tmp_path / f"{PREFIX}{os.getppid()}-def"  # a running actor's
    live.mkdir()
    older = tmp_path / f"{PREFIX}ghijkl"  # named before the pid was in the name: not ours to judge
    older.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / f"{PREFIX}{_ended_pid()}-lnk"
    link.symlink_to(target)

    actor = NodeTemplates()
    mine = Path(actor.folder)
    assert mine.name.startswith(f"{PREFIX}{os.getpid()}-")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [live.name, older.name, link.name, target.name, mine.name]
    )
    actor.stop()
    assert not mine.exists()
