"""pytest-timeout: devpool owns the per-test limit under devpool.

A limit that pytest-timeout enforced inside a worker would fail the test (`failed`, not
`timeout`) or os._exit the worker under the next test. So in workers pytest-timeout does
not act; the controller reads its `timeout` marker, its --timeout option, PYTEST_TIMEOUT
and its `timeout` ini value, and enforces them by killing the test's process group.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

PLUGIN = "timeout"  # pytest-timeout's entry-point name


def active(config: pytest.Config) -> bool:
    """Whether pytest-timeout is installed and loaded in this session."""
    return config.pluginmanager.has_plugin(PLUGIN)


def default_limit(config: pytest.Config) -> tuple[Any, str] | None:
    """pytest-timeout's default limit and where it was set, in its own order of precedence.

    None when pytest-timeout is not loaded or sets no limit (0 means none, as there).
    """
    if not active(config):
        return None
    found: tuple[Any, str] | None = None
    if config.getoption("timeout", None) is not None:
        found = (config.getoption("timeout"), "--timeout (pytest-timeout)")
    elif os.environ.get("PYTEST_TIMEOUT"):
        found = (os.environ["PYTEST_TIMEOUT"], "PYTEST_TIMEOUT (pytest-timeout)")
    elif config.getini("timeout"):
        found = (config.getini("timeout"), "the `timeout` ini value (pytest-timeout)")
    if found is None:
        return None
    try:
        if float(found[0]) == 0:
            return None
    except (TypeError, ValueError):
        pass  # devpool's own check names the setting and the bad value
    return found


def settings_fallback(config: pytest.Config) -> dict[str, tuple[Any, str]]:
    """pytest-timeout's default limit as devpool's test-timeout, when devpool sets none."""
    limit = default_limit(config)
    return {} if limit is None else {"test-timeout": limit}


def header_lines(config: pytest.Config) -> list[str]:
    """Say that devpool, not pytest-timeout, enforces the default limit of this run."""
    limit = default_limit(config)
    if limit is None:
        return []
    return [
        f"devpool: {limit[1]} {limit[0]} is enforced by devpool (process group killed, "
        "outcome timeout); pytest-timeout does not act in workers"
    ]


def quiet_worker(config: pytest.Config) -> None:
    """Unregister pytest-timeout in a worker: no SIGALRM, no timer thread, no os._exit."""
    module = sys.modules.get("pytest_timeout")
    plugin = config.pluginmanager.get_plugin(PLUGIN) or module
    if plugin is not None and config.pluginmanager.is_registered(plugin):
        config.pluginmanager.unregister(plugin)
