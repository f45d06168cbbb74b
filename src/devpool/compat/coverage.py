"""Coverage (pytest-cov, or `coverage run`): every worker measures into its own data file.

When the controller runs under coverage, each worker starts coverage with the controller's
configuration, made `parallel` so that its data goes to a file of its own beside the
controller's (coverage's subprocess start-up hook, COVERAGE_PROCESS_CONFIG). pytest-cov in
the controller combines them all when the run ends and writes its usual reports; under
`coverage run` with `parallel = true`, `coverage combine` does. The controller's own file
holds what collection ran (imports, module-level code); the workers' hold the tests.

pytest-cov itself is off in workers (--no-cov): its start erases data files and its end
combines them, which many workers must not do at once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from coverage import Coverage

# Set in a worker's environment when devpool asked coverage to measure it.
STARTED_BY_DEVPOOL = "DEVPOOL_COVERAGE"
_PROCESS_CONFIG = "COVERAGE_PROCESS_CONFIG"  # coverage's own: start in this (sub)process


def measuring() -> Coverage | None:
    """The Coverage instance measuring this process, if any."""
    # A process that coverage measures has imported it; importing it here only to ask would
    # cost every other run about 20 ms (the fixed cost of a run, issue 45).
    coverage = sys.modules.get("coverage")
    if coverage is None or not hasattr(coverage, "Coverage"):
        return None
    current: Coverage | None = coverage.Coverage.current()
    return current


def _pytest_cov(config: pytest.Config) -> Any:
    """pytest-cov's plugin object when it measures this session, else None."""
    plugin = config.pluginmanager.get_plugin("_cov")
    if plugin is None or getattr(plugin, "_disabled", False):
        return None
    return plugin


def _subprocesses_measured() -> bool:
    """coverage's own subprocess support (patch = subprocess) already reaches the workers."""
    return bool(os.environ.get(_PROCESS_CONFIG) or os.environ.get("COVERAGE_PROCESS_START"))


def worker_env(config: pytest.Config) -> dict[str, str]:
    """The controller's coverage configuration for the workers, each with its own data file."""
    cov = measuring()
    if cov is None or _subprocesses_measured():
        return {}
    from coverage.config import CoverageConfig

    worker_config = CoverageConfig.deserialize(cov.config.serialize())  # a copy, paths absolute
    worker_config.parallel = True  # a data file per worker, named by host, pid and a random part
    return {_PROCESS_CONFIG: worker_config.serialize(), STARTED_BY_DEVPOOL: "1"}


def worker_options(config: pytest.Config) -> list[str]:
    """--no-cov for workers when pytest-cov measures the controller (see the module doc)."""
    return ["--no-cov"] if _pytest_cov(config) is not None else []


def header_lines(config: pytest.Config) -> list[str]:
    """How the workers' coverage reaches the report."""
    cov = measuring()
    if cov is None:
        return []
    if _pytest_cov(config) is not None:
        return ["devpool: coverage: each worker writes its own data file; pytest-cov combines"]
    if cov.config.parallel:
        return ["devpool: coverage: each worker writes its own data file; `coverage combine`"]
    return [
        "devpool: WARNING: coverage runs without `parallel = true`: the workers' data files "
        "(.coverage.*) are left beside .coverage; merge them with `coverage combine --append`"
    ]


class WorkerCoverage:
    """A worker's side: coverage started, pytest-cov's per-test behaviour kept."""

    def __init__(self, config: pytest.Config) -> None:
        self.cov: Coverage | None = None
        self.pytest_cov = bool(getattr(config.option, "cov_source", None))
        self.contexts = getattr(config.option, "cov_context", None) == "test"

    def start(self, config: pytest.Config) -> None:
        """Make sure coverage measures this worker when the controller asked for it."""
        if not os.environ.get(STARTED_BY_DEVPOOL):
            return
        import coverage

        # A no-op when coverage's start-up hook (its .pth file) already started it.
        coverage.process_startup()
        self.cov = coverage.Coverage.current()
        plugin = config.pluginmanager.get_plugin("_cov")
        if plugin is not None:  # off here (--no-cov); its hooks would trip on no_cover tests
            config.pluginmanager.unregister(plugin)
        # The tests' own subprocesses are measured only where the project asked for it.
        if self.cov is None or "subprocess" not in getattr(self.cov.config, "patch", []):
            os.environ.pop(_PROCESS_CONFIG, None)
        os.environ.pop(STARTED_BY_DEVPOOL, None)

    @contextmanager
    def paused_for(self, item: pytest.Item) -> Iterator[None]:
        """pytest-cov's no_cover marker and fixture: the test's call is not measured."""
        cov = self.cov
        no_cover = item.get_closest_marker("no_cover") is not None or "no_cover" in getattr(
            item, "fixturenames", ()
        )
        if cov is None or not self.pytest_cov or not no_cover:
            yield
            return
        cov.stop()
        try:
            yield
        finally:
            cov.start()

    def switch_context(self, item: pytest.Item, when: str) -> None:
        """pytest-cov's --cov-context=test: one dynamic context per test phase."""
        if self.cov is not None and self.contexts:
            self.cov.switch_context(f"{item.nodeid}|{when}")
