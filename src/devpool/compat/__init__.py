"""Other pytest plugins, on their own terms: what the controller hands its workers, and
what a worker switches off so that one session's work done in many processes reads as one.

A devpool worker is not an xdist worker and does not claim to be one: plugins there see an
ordinary pytest session. Two things of xdist's are kept, for plugins whose state spans the
whole run: a worker's `config.workeroutput`, handed to the controller at its end
(outputs.py), and, to syrupy alone, the xdist worker's name while its session ends
(syrupy.py). Each module here handles one plugin concern.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from devpool.compat import benchmark as benchmark
from devpool.compat import coverage as coverage
from devpool.compat import outputs as outputs
from devpool.compat import randomly as randomly
from devpool.compat import rerunfailures as rerunfailures
from devpool.compat import session_files as session_files
from devpool.compat import syrupy as syrupy
from devpool.compat import timeout as timeout
from devpool.compat import unknown as unknown


def settings_fallback(config: pytest.Config) -> dict[str, tuple[Any, str]]:
    """devpool settings read from other plugins' options: name → (value, where it came from).

    They apply only where neither --devpool-<name> nor [tool.devpool] gives one.
    """
    return {**rerunfailures.settings_fallback(config), **timeout.settings_fallback(config)}


def configure_controller(config: pytest.Config) -> None:
    """In the controller, once devpool is on: say in the header what devpool takes over."""
    config.pluginmanager.register(ControllerPlugins(), "devpool-controller-plugins")


def worker_options(config: pytest.Config) -> list[str]:
    """Options appended to every worker's pytest arguments."""
    return [*randomly.worker_options(config), *coverage.worker_options(config)]


def worker_env(config: pytest.Config) -> dict[str, str]:
    """Environment variables every worker of this run starts with."""
    return coverage.worker_env(config)


def header_lines(config: pytest.Config) -> list[str]:
    """One line per plugin whose behaviour devpool takes over, for the session header."""
    return [
        *rerunfailures.header_lines(config),
        *timeout.header_lines(config),
        *coverage.header_lines(config),
    ]


def configure_worker(config: pytest.Config) -> None:
    """In a worker, before the other plugins' pytest_configure runs (devpool's is tryfirst)."""
    session_files.configure_worker(config)
    rerunfailures.no_status_server()
    config.pluginmanager.register(WorkerPlugins(config), "devpool-worker-plugins")


class ControllerPlugins:
    """The controller's side: header lines; session state merged from every worker's output
    (compat/outputs.py) before the plugins that keep it end their session."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return header_lines(config)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, None, None]:
        config = session.config
        sidecars, self.lines = syrupy.controller_finishing(config)
        benchmark.controller_finishing(config, session.items)
        try:
            return (yield)
        finally:
            syrupy.controller_finished(config, sidecars)

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        unknown_line = unknown.summary_line(config)
        for line in [*self.lines, *([unknown_line] if unknown_line else [])]:
            terminalreporter.write_line(line, yellow=True)


class WorkerPlugins:
    """Hooks a worker adds so that other plugins act once, in the controller, or not at all."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.coverage = coverage.WorkerCoverage(config)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # Unregistered here, after every pytest_configure ran (their markers, options and
        # state exist) and before any test: from now on these plugins do not act.
        session_files.quiet_worker(self.config)
        rerunfailures.quiet_worker(self.config)
        timeout.quiet_worker(self.config)
        benchmark.quiet_worker(self.config)
        self.coverage.start(self.config)

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, None, None]:
        """Plugins publish their share of the run's state (compat/outputs.py)."""
        with syrupy.worker_finishing(self.config):
            result = yield
        benchmark.worker_finished(self.config, self.config.workeroutput)  # type: ignore[attr-defined]
        return result

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.coverage.switch_context(item, "setup")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        self.coverage.switch_context(item, "run")
        with self.coverage.paused_for(item):
            return (yield)

    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        self.coverage.switch_context(item, "teardown")
