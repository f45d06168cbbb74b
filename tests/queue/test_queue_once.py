"""Once-fixtures under --devpool-queue (issue 57): each job sets up its own, once, and only
if it claims a test that uses it. Two real jobs share one queue run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from pg_server import Server

FAST = ("-p", "devpool.plugin", "-p", "no:hypothesispytest", "-p", "no:cacheprovider")
FAST += ("-p", "no:randomly")

CONFTEST = """
import os
from pathlib import Path

import pytest

OUT = Path({out!r})


@pytest.fixture(scope="session")
def server():
    with open(OUT / "setups", "a") as handle:
        handle.write(os.environ["JOB"] + "\\n")
    return os.getpid()
"""

SUITE = """
import os
from pathlib import Path

import pytest

OUT = Path({out!r})


def ran(name):
    with open(OUT / (name + ".runs"), "a") as handle:
        handle.write(os.environ["JOB"] + "\\n")


@pytest.mark.parametrize("i", range(6))
def test_user(server, i):
    assert server != os.getpid()
    ran(f"user{{i}}")


@pytest.mark.parametrize("i", range(6))
def test_other(i):
    ran(f"other{{i}}")
"""


def test_each_job_of_a_queue_run_sets_up_its_own_once(postgres: Server, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "pyproject.toml").write_text("[tool.devpool.once]\nserver = {}\n")
    (tmp_path / "conftest.py").write_text(CONFTEST.format(out=str(out)))
    (tmp_path / "test_once_mix.py").write_text(SUITE.format(out=str(out)))
    run = f"once-{time.time_ns()}"
    jobs = {}
    for name in ("a", "b"):
        env = {**os.environ, "JOB": name, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        env.pop("PYTEST_ADDOPTS", None)
        (tmp_path / f"locks-{name}").mkdir()
        args = [sys.executable, "-m", "pytest", *FAST, "test_once_mix.py", "-q"]
        args += ["--devices=sim:0-1", f"--devpool-lock-dir={tmp_path / f'locks-{name}'}"]
        args += [f"--devpool-queue={postgres.url}", f"--devpool-queue-run={run}"]
        args += [f"--devpool-run-dir={tmp_path / ('run-' + name)}"]
        jobs[name] = subprocess.Popen(
            args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip
    outputs = {name: proc.communicate(timeout=240)[0] for name, proc in jobs.items()}
    assert all(proc.returncode == 0 for proc in jobs.values()), outputs
    runs = {p.stem: p.read_text().split() for p in out.glob("*.runs")}
    assert len(runs) == 12 and all(len(who) == 1 for who in runs.values()), runs  # each once
    users = {who[0] for name, who in runs.items() if name.startswith("user")}
    setups = (out / "setups").read_text().split()
    assert sorted(setups) == sorted(users), (setups, runs)  # once in each job that claimed one
