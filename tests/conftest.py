"""Fixtures shared by devpool's unit and end-to-end tests."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pg_server import Server, remove, server_bin, start_server

pytest_plugins = ["pytester"]

# The environment of the user's pytest process, when devpool runs this suite: set by the
# controller before any worker starts, read in each worker (see plain_environment).
SUITE_ENVIRON = "DEVPOOL_SUITE_ENVIRON"


def _keep_environ(config: pytest.Config) -> None:
    if config.pluginmanager.has_plugin("devpool-controller"):
        own = {name: value for name, value in os.environ.items() if name != SUITE_ENVIRON}
        os.environ[SUITE_ENVIRON] = json.dumps(own)


def pytest_configure(config: pytest.Config) -> None:
    if SUITE_ENVIRON not in os.environ:  # not in a session of this suite run by its tests
        _keep_environ(config)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    # Again once every module is imported, as plain pytest's tests would find it: what a
    # module sets at import stays (ray_nodes.py keeps Ray's processes on 127.0.0.1).
    if not session.config.getoption("devpool_worker", None):
        _keep_environ(session.config)


# What tests need beyond one CPU slot, by node id prefix (a file, or tests of it): devpool
# reads these markers when it runs this suite (pyproject.toml declares the resources); plain
# pytest ignores them.
# - cpus(2): the test runs sessions side by side, or against pytest-xdist, and keeps both
#   cores of a 2-core host busy; beside another test it would measure the other.
# - resources(session_ports=1): the sessions the test starts lease ports in lock folders of
#   their own and their tests bind them (ranks meeting on MASTER_PORT, gloo, the demo's
#   distributed tests): two such sessions at once could be handed the same port.
# - resources(ray=1): a two-node Ray cluster on this host, one at a time.
# - one module, one worker: the tests share a module fixture that takes seconds to start (a
#   Ray cluster, the demo run): tied as one chain (dependency(), which records and skips
#   nothing), they run in one worker in their order, and the fixture starts once.
CPUS_2 = (pytest.mark.cpus(2),)
SESSION_PORTS = (pytest.mark.resources(session_ports=1),)
ONE_CLUSTER = (pytest.mark.resources(ray=1, session_ports=1), pytest.mark.dependency())
NEEDS: dict[str, tuple[pytest.MarkDecorator, ...]] = {
    "tests/test_benchmark_guard.py::test_devpool_stays_faster_than_xdist": CPUS_2,
    "tests/e2e/test_concurrent_runs.py": CPUS_2,
    "tests/e2e/test_fault_matrix.py": CPUS_2,
    # They measure a test's CPU load: another test on the other core moves it past their bounds.
    "tests/e2e/test_cpu_slots.py": CPUS_2,
    "tests/worker/test_cpu_load.py": CPUS_2,
    # Its module fixture runs every row's command at once: once, in one worker.
    "tests/e2e/test_bad_input.py::test_a_mistake_gets_one_sentence": (pytest.mark.dependency(),),
    "tests/e2e/test_ray.py": ONE_CLUSTER,
    "tests/e2e/test_ray_select.py": ONE_CLUSTER,
    "tests/serve/test_ray_view.py": ONE_CLUSTER,
    "tests/e2e/test_ranks.py": SESSION_PORTS,
    "tests/e2e/test_ranks_endings.py": SESSION_PORTS,
    "tests/e2e/test_ranks_torch.py": SESSION_PORTS,
    "tests/e2e/test_master_port.py": SESSION_PORTS,
    "tests/e2e/test_host_resources.py": SESSION_PORTS,
    "tests/e2e/test_cli_newcomer.py::test_the_readmes_first_command": SESSION_PORTS,
    "tests/test_docs.py::test_the_first_example_of_a_page_runs": SESSION_PORTS,
    "tests/test_docs_blocks.py::test_every_command_of_the_page_runs": SESSION_PORTS,
    "tests/test_docs_blocks.py::test_every_sample_session": SESSION_PORTS,
    "tests/test_docs_blocks.py::test_the_install_and_the_demo_work": SESSION_PORTS,
    "tests/report/test_html_report.py::test_demo_run_renders": (
        *SESSION_PORTS,
        pytest.mark.dependency(),
    ),
    "tests/report/test_html_report.py::test_chromium_screenshot_shows_passed_bars": (
        *SESSION_PORTS,
        pytest.mark.dependency(),
    ),
    "tests/report/test_html_report.py::test_chromium_dom_has_eight_device_rows": (
        *SESSION_PORTS,
        pytest.mark.dependency(),
    ),
}

# Selective runs (docs/contributing.md) see what a test runs in its own process and in the
# processes below it that import devpool or are its forks (pytester's sessions, subprocesses,
# the command line: select/children.py). A module whose processes run devpool where no
# recording sees it depends on every source file (fail closed): Ray's workers (started by
# its own daemons) and devpool installed in a fresh venv (a copy outside the rootdir).
STARTS_PROCESSES = re.compile(r"\b(ray_nodes|ray_cluster|venv)\b")
SOURCES = pytest.mark.depends_on("src/devpool/*")


@functools.cache
def _starts_processes(path: Path) -> bool:
    try:
        return STARTS_PROCESSES.search(path.read_text(encoding="utf-8")) is not None
    except (OSError, UnicodeDecodeError):
        return True


# The tests left out of the fast tier, `-m "not slow"` (docs/contributing.md): real sessions,
# servers, clusters, browsers, fresh venvs; by node id prefix. What remains runs in about
# two minutes and covers every package's own logic in this process.
SLOW = (
    "tests/e2e/",
    "tests/conformance/",
    "tests/gpu/",
    # tests/queue/ but its pure modules (test_junit_cases, test_queue_link, test_status)
    "tests/queue/test_queue_classes.py",
    "tests/queue/test_queue_jobs.py",
    "tests/queue/test_queue_once.py",
    "tests/queue/test_queue_report.py",
    "tests/queue/test_store.py",
    "tests/queue/test_store_invariants.py",
    "tests/history/test_history_pg.py",
    "tests/serve/test_browser.py",
    "tests/serve/test_page_truth.py",
    "tests/serve/test_queue_view.py",
    "tests/serve/test_ray_view.py",
    "tests/select/test_select_monitoring.py",
    "tests/report/test_html_report.py::test_demo_run",
    "tests/report/test_html_report.py::test_chromium",
    "tests/test_benchmark_guard.py::test_devpool_stays_faster_than_xdist",
    "tests/test_devpool_off.py",
    "tests/test_docs_blocks.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
        for prefix, marks in NEEDS.items():
            if item.nodeid.startswith(prefix):
                for mark in marks:
                    item.add_marker(mark)
        if item.path.suffix == ".py" and _starts_processes(item.path):
            item.add_marker(SOURCES)


@functools.cache
def _plain_environ() -> dict[str, str] | None:
    """The user's pytest process's environment, in a devpool worker; None elsewhere."""
    outer = os.environ.get(SUITE_ENVIRON)
    return None if outer is None else dict(json.loads(outer))


def _as_plain(request: pytest.FixtureRequest) -> Iterator[None]:
    plain = _plain_environ() if request.config.getoption("devpool_worker", None) else None
    if plain is None:
        yield
        return
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


@pytest.fixture(scope="session", autouse=True)
def plain_session_environment(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under devpool, the tests' session and module fixtures see the environment plain
    pytest would give them (see plain_environment); set up before any of them."""
    yield from _as_plain(request)


@pytest.fixture(autouse=True)
def plain_environment(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under devpool, each test sees the environment plain pytest would give it.

    A worker's environment has devpool's own variables (its devices, the sim platform's
    visibility variable, its run id, its artifacts, a thread budget): a session these tests
    start would inherit them and be narrowed, numbered or budgeted by the run around it,
    so for the test's duration they are put back as the user's pytest process had them
    (again for each test: the worker names the test it runs in the environment)."""
    yield from _as_plain(request)


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
