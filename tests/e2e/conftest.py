"""Fixtures of the end-to-end tests: a folder for what target tests record, a lock folder,
the environment of selective runs, a two-node Ray cluster on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def out(pytester: pytest.Pytester) -> Path:
    """Where the target project's tests record what they saw (see sessions.PRELUDE)."""
    path = pytester.path / "out"
    path.mkdir()
    return path


@pytest.fixture
def _no_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    """No plugin autoload and no PYTEST_ADDOPTS in the sessions a test starts (the modules
    that use it: pytestmark = pytest.mark.usefixtures("_no_autoload"))."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


@pytest.fixture
def lock(tmp_path: Path) -> Path:
    """A lock folder of the session's own, so no two tests share device leases."""
    path = tmp_path / "locks"
    path.mkdir()
    return path


@pytest.fixture
def selective_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No plugin autoload in the sessions and their workers, no CI variables: `auto` asks
    git, as on a developer's machine; BREAK_PLAIN unset (select_project.PROJECT reads it)."""
    from select_project import CI_VARIABLES

    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for name in (*CI_VARIABLES, "BREAK_PLAIN"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two Ray nodes on 127.0.0.1, 4 NPU each, for the module (Ray starts slowly); stopped
    through its own API. A module using it imports ray_cluster first (it skips without Ray)."""
    from ray_cluster import two_node_cluster

    with two_node_cluster(dashboard=True) as started:  # devpool locks asks its state API
        yield started
