"""pytest-rerunfailures: its reruns become devpool's reruns.

devpool retries a failed test in a fresh worker and reports fail-then-pass as `flaky`.
pytest-rerunfailures rerunning inside a worker would hide those attempts (and a crash
would be blamed on another test), so in workers it does not act; the controller reads
--reruns / --force-reruns / --reruns-delay (and their ini values) as the defaults and
`@pytest.mark.flaky(reruns=N, reruns_delay=S)` per test (see Request.reruns).
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from typing import Any

import pytest

from devpool.errors import DevpoolError

PLUGIN = "rerunfailures"  # pytest-rerunfailures' entry-point name


def active(config: pytest.Config) -> bool:
    """Whether pytest-rerunfailures is installed and loaded in this session."""
    return config.pluginmanager.has_plugin(PLUGIN)


def _global_reruns(config: pytest.Config) -> tuple[Any, str] | None:
    if config.getoption("force_reruns", None) is not None:
        return config.getoption("force_reruns"), "--force-reruns (pytest-rerunfailures)"
    if config.getoption("reruns", None) is not None:
        return config.getoption("reruns"), "--reruns (pytest-rerunfailures)"
    if config.getini("reruns"):
        return config.getini("reruns"), "the `reruns` ini value (pytest-rerunfailures)"
    return None


def settings_fallback(config: pytest.Config) -> dict[str, tuple[Any, str]]:
    """--reruns and --reruns-delay as devpool's reruns and reruns-delay, when devpool sets none."""
    if not active(config):
        return {}
    found: dict[str, tuple[Any, str]] = {}
    reruns = _global_reruns(config)
    if reruns is not None:
        found["reruns"] = reruns
    if config.getoption("reruns_delay", None) is not None:
        found["reruns-delay"] = (
            config.getoption("reruns_delay"),
            "--reruns-delay (pytest-rerunfailures)",
        )
    elif config.getini("reruns_delay"):
        found["reruns-delay"] = (
            config.getini("reruns_delay"),
            "the `reruns_delay` ini value (pytest-rerunfailures)",
        )
    if config.getoption("fail_on_flaky", False):
        found["flaky-result"] = ("fail", "--fail-on-flaky (pytest-rerunfailures)")
    return found


def marker_reruns(item: pytest.Item) -> tuple[int | None, float | None]:
    """A test's own (reruns, delay) from @pytest.mark.flaky, as pytest-rerunfailures reads it.

    (None, None) when the test has no such marker, pytest-rerunfailures is not loaded (the
    `flaky` name belongs to whichever plugin is), or --force-reruns overrides every marker.
    """
    mark = item.get_closest_marker("flaky")
    if mark is None:
        return None, None
    config = item.config
    if not active(config) or config.getoption("force_reruns", None) is not None:
        return None, None
    nodeid = item.nodeid
    reruns = mark.kwargs.get("reruns", mark.args[0] if mark.args else 1)
    if isinstance(reruns, bool) or not isinstance(reruns, int) or reruns < 0:
        raise DevpoolError(
            f"{nodeid}: @pytest.mark.flaky(reruns={reruns!r}) needs a whole number ≥ 0"
        )
    delay = mark.kwargs.get("reruns_delay", mark.args[1] if len(mark.args) > 1 else 0)
    if isinstance(delay, bool) or not isinstance(delay, (int, float)):
        raise DevpoolError(
            f"{nodeid}: @pytest.mark.flaky(reruns_delay={delay!r}) needs a number of seconds"
        )
    if not _condition(item, mark.kwargs.get("condition", True)):
        return 0, None
    if config.getoption("reruns_mode", "strict") == "append":
        extra = _global_reruns(config)
        if extra is not None:
            # A bad global value is reported where the settings are read.
            with contextlib.suppress(TypeError, ValueError):
                reruns += int(extra[0])
    return reruns, max(0.0, float(delay))


def _condition(item: pytest.Item, condition: object) -> bool:
    """flaky(condition=...): a bool, or a string evaluated as skipif evaluates its strings."""
    if not isinstance(condition, str):
        return bool(condition)
    names = {"os": os, "sys": sys, "platform": platform, "config": item.config}
    try:
        return bool(eval(condition, names))  # noqa: S307 - the test author's own expression
    except Exception as exc:  # noqa: BLE001 - any error in the expression is the user's
        raise DevpoolError(
            f"{item.nodeid}: @pytest.mark.flaky(condition={condition!r}) failed: {exc!r}"
        ) from None


def header_lines(config: pytest.Config) -> list[str]:
    """Say that pytest-rerunfailures' --reruns runs as devpool's reruns."""
    if not active(config):
        return []
    lines = []
    reruns = _global_reruns(config)
    if reruns is not None:
        lines.append(
            f"devpool: {reruns[1]} {reruns[0]} runs as devpool reruns: each retry in a fresh "
            "worker, fail-then-pass reported flaky"
        )
    filters = [
        option
        for option, dest in (("--only-rerun", "only_rerun"), ("--rerun-except", "rerun_except"))
        if config.getoption(dest, None) or config.getini(dest)
    ]
    if filters:
        lines.append(
            f"devpool: WARNING: {' and '.join(filters)} (pytest-rerunfailures) not applied: "
            "devpool reruns every failed test"
        )
    return lines


def no_status_server() -> None:
    """Before its pytest_configure: no status server thread in a controller or a worker.

    With pytest-xdist installed, pytest-rerunfailures starts a socket server thread in every
    process that is not an xdist worker, for xdist's crashed-item reruns. devpool's
    processes are not xdist's and do not rerun there; the thread would only make the
    controller and the fork server's templates unsafe to fork. Its no-op status store
    stands in."""
    module: Any = sys.modules.get("pytest_rerunfailures")
    if module is not None and hasattr(module, "StatusDB") and hasattr(module, "ServerStatusDB"):
        module.ServerStatusDB = module.StatusDB


def quiet_worker(config: pytest.Config) -> None:
    """Unregister pytest-rerunfailures in a worker: each attempt is one run, seen by devpool."""
    module = sys.modules.get("pytest_rerunfailures")
    plugin = config.pluginmanager.get_plugin(PLUGIN) or module
    if plugin is not None and config.pluginmanager.is_registered(plugin):
        config.pluginmanager.unregister(plugin)
