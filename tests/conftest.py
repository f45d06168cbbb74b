"""Fixtures shared by devpool's unit and end-to-end tests."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pg_server import Server, remove, server_bin, start_server

pytest_plugins = ["pytester"]

# The environment of the user's pytest process, when devpool runs this suite: set by the
# controller before any worker starts, read in each worker (see plain_environment).
SUITE_ENVIRON = "DEVPOOL_SUITE_ENVIRON"


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.has_plugin("devpool-controller") and SUITE_ENVIRON not in os.environ:
        os.environ[SUITE_ENVIRON] = json.dumps(dict(os.environ))


# What tests need beyond one CPU slot, by node id prefix (a file, or one test of it): devpool
# reads these markers when it runs this suite (pyproject.toml); plain pytest ignores them.
# cpus(2): the test runs several sessions, or sessions against pytest-xdist, side by side and
# keeps both cores of a 2-core host busy; beside another test it would measure the other.
NEEDS: dict[str, tuple[pytest.MarkDecorator, ...]] = {
    "tests/test_benchmark_guard.py::test_devpool_stays_faster_than_xdist": (pytest.mark.cpus(2),),
    "tests/e2e/test_concurrent_runs.py": (pytest.mark.cpus(2),),
    "tests/e2e/test_fault_matrix.py": (pytest.mark.cpus(2),),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for prefix, marks in NEEDS.items():
            if item.nodeid.startswith(prefix):
                for mark in marks:
                    item.add_marker(mark)


@pytest.fixture(autouse=True)
def plain_environment(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under devpool, each test sees the environment plain pytest would give it.

    A worker's environment has devpool's own variables (its devices, the sim platform's
    visibility variable, its run id, its artifacts, a thread budget): a session these tests
    start would inherit them and be narrowed, numbered or budgeted by the run around it,
    so for the test's duration they are put back as the user's pytest process had them."""
    outer = os.environ.get(SUITE_ENVIRON)
    if outer is None or not request.config.getoption("devpool_worker", None):
        yield
        return
    plain: dict[str, str] = json.loads(outer)
    patch = pytest.MonkeyPatch()
    try:
        for name in [name for name in os.environ if name not in plain]:
            patch.delenv(name)
        for name, value in plain.items():
            if os.environ.get(name) != value:
                patch.setenv(name, value)
        yield
    finally:
        patch.undo()


def _unfenced(lines: list[str]) -> list[str]:
    """The lines GitHub would read as commands: those outside every stop-commands fence."""
    outside: list[str] = []
    token: str | None = None
    for line in lines:
        if token is None:
            if line.startswith("::stop-commands::"):
                token = line[len("::stop-commands::") :]
                assert token, "a stop-commands line needs a token"
            else:
                outside.append(line)
        elif line == f"::{token}::":
            token = None
    assert token is None, "a stop-commands fence was never closed"
    return outside


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """pytester, with pytest-randomly, pytest-asyncio and syrupy off in the sessions it runs.

    Those sessions assert on order ("later tests did not run"), pytest-asyncio warns in
    each, and syrupy's pytest_sessionfinish fails in pytester's in-process collections
    (getitems: the session has no exitstatus yet). tests/e2e/test_plugins.py and
    test_session_state_plugins.py turn every plugin back on where they are what is tested.
    Pytester clears PYTEST_ADDOPTS when it starts, so this is set after it.
    """
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:randomly -p no:asyncio -p no:syrupy")
    return pytester


@pytest.fixture
def unfenced() -> Callable[[list[str]], list[str]]:
    """Lines of a GitHub log that are outside every ::stop-commands:: fence."""
    return _unfenced


@pytest.fixture
def lock_dir(tmp_path: Path) -> Path:
    """A lock folder of the test's own."""
    return tmp_path / "locks"


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    """Child processes a test starts (child_processes.spawn); killed and reaped after it."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Server]:
    """A real PostgreSQL server for the session (pg_server.py), for the queue's and the fleet
    history's tests; each test uses run ids or a database of its own."""
    if server_bin() is None:
        why = "no PostgreSQL server binaries (initdb, pg_ctl) on PATH or in /usr/lib/postgresql"
        if os.environ.get("CI") == "true":
            pytest.fail(why + ": .ci/run installs them", pytrace=False)
        pytest.skip(why)
    pytest.importorskip("psycopg", reason="psycopg is not installed (the [queue] extra)")
    server = start_server()
    try:
        yield server
    finally:
        server.stop()
        remove(server)
